//! The kinds of source and driver this build knows, one line a kind: what a pipeline
//! file may name under a source (`file:`, `datagen:`) or an endpoint (`sqlite:`, ...),
//! and what `sluice driver` serves by name.
//!
//! A new source is a crate implementing `sluice_source_sdk::SourceKind` and a
//! `with_source` line here; a new built-in driver is a `with_builtin` line, whatever its
//! family: a Flow driver's `Builtin::new…` names its endpoint configuration type
//! (checked when the pipeline file is read), its endpoint type, the configuration keys
//! that hold paths, and its constructor (the driver declares how it commits itself:
//! `Driver::declared`); an epoch sink or an output crate gives its `kind()`.

use sluice_airbyte_source::{AirbyteKind, SingerKind};
use sluice_datagen::DatagenKind;
use sluice_driver_sdk::Builtin;
use sluice_driver_sdk::flow::EndpointType;
use sluice_file::FileKind;
use sluice_http::HttpKind;
use sluice_kafka::KafkaKind;
use sluice_memory::MemoryDriver;
use sluice_mysql::MysqlDriver;
use sluice_mysql_cdc::MysqlCdcKind;
use sluice_nats::NatsKind;
use sluice_postgres::PostgresDriver;
use sluice_postgres_cdc::PostgresCdcKind;
use sluice_redis::RedisDriver;
use sluice_runtime::registry::{Command, Grpc, Registry};
use sluice_source_sdk::kind;
use sluice_sqlite::SqliteDriver;
use std::sync::Arc;

/// Every kind linked into this binary.
pub fn registry() -> Registry {
    use EndpointType::{SluiceMemory, SluiceMysql, SluicePostgres, SluiceRedis, Sqlite};
    Registry::new()
        .with_source(kind::<FileKind>())
        .with_source(kind::<DatagenKind>())
        .with_source(kind::<KafkaKind>())
        .with_source(kind::<NatsKind>())
        .with_source(kind::<PostgresCdcKind>())
        .with_source(kind::<MysqlCdcKind>())
        .with_source(kind::<HttpKind>())
        .with_source(kind::<AirbyteKind>())
        .with_source(kind::<SingerKind>())
        .with_builtin(Builtin::new::<sluice_memory::config::EndpointConfig>(
            "memory",
            SluiceMemory,
            &["path"],
            || Arc::new(MemoryDriver::new()),
        ))
        .with_builtin(Builtin::new::<sluice_mysql::config::EndpointConfig>(
            "mysql",
            SluiceMysql,
            &[],
            || Arc::new(MysqlDriver::new()),
        ))
        .with_builtin(Builtin::new::<sluice_postgres::config::EndpointConfig>(
            "postgres",
            SluicePostgres,
            &[],
            || Arc::new(PostgresDriver::new()),
        ))
        .with_builtin(Builtin::new::<sluice_sqlite::config::EndpointConfig>(
            "sqlite",
            Sqlite,
            &["path"],
            || Arc::new(SqliteDriver::new()),
        ))
        .with_builtin(Builtin::new::<sluice_redis::config::EndpointConfig>(
            "redis",
            SluiceRedis,
            sluice_redis::config::PATHS,
            || Arc::new(RedisDriver::new()),
        ))
        .with_builtin(sluice_iceberg::kind())
        .with_builtin(sluice_files_output::kind())
        .with_builtin(sluice_nats_output::kind())
        .with_builtin(sluice_kafka_output::kind())
        .with_driver(Grpc)
        .with_driver(Command)
}
