//! What only tests, benchmarks and torture runs use: private servers, the test broker,
//! and the fixtures of the drivers' own tests. No product crate depends on this one, so
//! none of it ships in the `sluice` binary.
//!
//! - [`conformance`]: the table-writing drivers' fixtures (the pageviews collection,
//!   bindings, Load/Store messages, store-specific scenarios, TLS certificates).
//! - [`etcd`]: a private single-member etcd ([`etcd::PrivateEtcd`]).
//! - [`postgres`]: a private PostgreSQL with `wal_level=logical`
//!   ([`postgres::LogicalPostgres`]).
//! - [`tansu`]: the test Kafka broker, started when none answers, and a private one
//!   requiring TLS and SASL ([`tansu::SecuredTansu`]).
//! - [`mysql`]: a database of one's own on the shared MariaDB.
//! - [`mariadb`]: a private `mariadbd` with the binary log on ([`mariadb::BinlogMariadb`]).
//! - [`nats`]: a private nats-server requiring TLS, a password or a token
//!   ([`nats::PrivateNats`], [`nats::SecuredNats`]).
//! - [`s3`]: the local S3-compatible server (moto), started when none answers, and a
//!   bucket of a test's own ([`s3::TestBucket`]).
//! - [`schema`]: a connector's configuration schema checked as the runtime checks it.
//! - [`modules`]: the cycles of a crate's module graph, for the tests that keep none.

pub mod conformance;
pub mod etcd;
pub mod mariadb;
pub mod modules;
pub mod mysql;
pub mod nats;
pub mod ports;
pub mod postgres;
pub mod redis;
pub mod s3;
pub mod schema;
pub mod tansu;
