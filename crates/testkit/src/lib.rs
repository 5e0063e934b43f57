//! What only tests, benchmarks and torture runs use: private servers, the test broker,
//! and the fixtures of the drivers' own tests. No product crate depends on this one, so
//! none of it ships in the `sluice` binary.
//!
//! - [`conformance`]: the table-writing drivers' fixtures (the pageviews collection,
//!   bindings, Load/Store messages, store-specific scenarios, TLS certificates).
//! - [`etcd`]: a private single-member etcd ([`etcd::PrivateEtcd`]).
//! - [`postgres`]: a private PostgreSQL with `wal_level=logical`
//!   ([`postgres::LogicalPostgres`]).
//! - [`tansu`]: the test Kafka broker, started when none answers.
//! - [`mysql`]: a database of one's own on the shared MariaDB.
//! - [`schema`]: a connector's configuration schema checked as the runtime checks it.
//! - [`modules`]: the cycles of a crate's module graph, for the tests that keep none.

pub mod conformance;
pub mod etcd;
pub mod modules;
pub mod mysql;
pub mod postgres;
pub mod schema;
pub mod tansu;
