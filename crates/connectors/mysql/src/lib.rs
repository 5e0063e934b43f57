//! The MariaDB/MySQL driver (work in progress).
