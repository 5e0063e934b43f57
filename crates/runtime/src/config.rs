//! The pipeline file. (stub)
