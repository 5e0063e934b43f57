//! The PostgreSQL driver (work in progress).
