//! The transaction loop. (stub)
