//! The MariaDB/MySQL driver, in the authoritative commit pattern: each transaction's
//! rows, the runtime checkpoint and a fence check commit in one InnoDB transaction, so a
//! crash at any point leaves the database holding exactly the effects of the checkpoint
//! it holds, and a zombie shard can never commit after a newer instance has opened.
//! Rows move in bulk (`LOAD DATA LOCAL INFILE`), keys are looked up in batches (`IN`
//! lists of up to 1 MiB).
//!
//! - [`config`]: what the user writes (`{"url": ...}`, `{"table": ...}`) and its schemas.
//! - [`sql`]: tables, statements and the text forms of values (`LOAD DATA` rows, key
//!   lists).
//! - [`tls`]: `ssl-mode` and `ssl-ca` as MySQL clients read them, over rustls.
//! - [`client`]: connections, error classification, the catalog, bulk loads, and the
//!   client calls the SQL kit's Apply planner and fencing protocol run.
//! - [`MysqlDriver`] (`driver.rs`): Spec, Validate, Apply and Open.
//! - `transactor.rs`: loads, stores and commits of one shard (a `FencedStore`).
//!
//! ```text
//!   <database>.sluice_checkpoints(materialization, key_begin, key_end, fence, checkpoint)
//!   <database>.<table per binding>(keys…, values…, flow_document)  PRIMARY KEY(keys…) unless delta
//! ```
//!
//! Tested against MariaDB 10.11; MySQL 8 differs only in the key collation's name
//! ([`sql::Flavor`]).

pub mod client;
pub mod config;
mod driver;
pub mod sql;
pub mod tls;
mod transactor;

pub use driver::MysqlDriver;
