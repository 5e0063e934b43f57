//! The source model. (stub)
