//! The recovery log. (stub)
