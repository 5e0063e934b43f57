//! `sluice-bench` (run as `sluice bench ...`): benchmarks that print figures. Each benchmark is a sub-module with
//! its own arguments; they print human-readable text, or one JSON object with `--json`.

mod cdc;
mod cluster;
mod combine;
mod failover;
mod http;
mod iceberg;
mod latency;
mod loads;
mod mysql;
mod mysql_cdc;
mod outputs;
mod postgres;
mod scale;
mod skew;
mod sources;
mod sql;

use clap::{Parser, Subcommand};
use sluice_app::logging::{self, LogArgs};

/// Documents are many small allocations; the benchmarks that combine in this process
/// measure them with the allocator `sluice` runs on (see its `main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks that print throughput figures: human-readable text, or one JSON object with
/// `--json`. Those that run pipelines run the `sluice` binary beside this one.
#[derive(Parser)]
#[command(name = "sluice bench", bin_name = "sluice bench", version)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::run(cli.log.log_format, || run(cli.command))
}

#[derive(Subcommand)]
enum BenchCommand {
    /// PostgreSQL change data capture while a load inserts rows, against the same rows
    /// read from a file: rows/s of each, their ratio, replication lag p99.
    Cdc(cdc::CdcArgs),
    /// One pipeline split by key range over 1, 2 and 3 processes into PostgreSQL:
    /// docs/s per process count and each process's CPU time.
    Cluster(cluster::ClusterArgs),
    /// Parse-only versus the whole combiner path over generated documents.
    Combine(combine::CombineArgs),
    /// An `http` source under `cluster:` (3 members, private etcd) with its holder
    /// SIGKILLed: how long no POST is acknowledged, per kill (p50, max), and exactness.
    Failover(failover::FailoverArgs),
    /// Clients pushing to the HTTP source into SQLite: batches' docs/s, then the time
    /// of one-document requests to their durable 200 (p50, p99).
    Http(http::HttpArgs),
    /// Pageviews into an Apache Iceberg table, against parquet's ArrowWriter writing the
    /// same batches and pyiceberg appending the same rows: rows/s, MB/s and ratios. With
    /// `--mode upsert`, reduced twice into a table that is the view, against pyiceberg's
    /// upsert: docs/s, files, the ratio and peak RSS.
    Iceberg(iceberg::IcebergArgs),
    /// One document at a time through `sluice run --follow`: the time from its source
    /// until its row is visible in the store (p50, p90, p99).
    Latency(latency::LatencyArgs),
    /// One transaction that loads every key of a large PostgreSQL table, under a small
    /// memory budget: peak RSS, exactness, the reload's cost over the first load.
    Loads(loads::LoadsArgs),
    /// Pageviews' changes published to Kafka, NATS and files in JSON lines and Avro,
    /// against a plain producer sending the same messages: msgs/s, MB/s and ratios.
    Outputs(outputs::OutputsArgs),
    /// Sluice into PostgreSQL against a hand-written bulk loader and row-by-row upserts.
    Postgres(sql::SqlArgs<postgres::Postgres>),
    /// Sluice into MariaDB/MySQL against a hand-written bulk loader and row-by-row upserts.
    Mysql(sql::SqlArgs<mysql::Mysql>),
    /// MariaDB change data capture (binary log) while a load inserts rows, against the
    /// same rows read from a file: rows/s of each, their ratio, lag p99.
    MysqlCdc(cdc::CdcArgs),
    /// The quickstart pipeline on 1 core and on 2 cores (`taskset`): docs/s of each and
    /// their ratio, what one process gains from a second core.
    Scale(scale::ScaleArgs),
    /// A cluster of 3 members, 6 shards, two hot ones on one member: shards weighed by
    /// count, then by load: drain time, each member's share, docs/s and CPU.
    Skew(skew::SkewArgs),
    /// The same documents preloaded into a file, a 4-partition Kafka topic and a NATS
    /// stream, each materialized into PostgreSQL: docs/s of each, brokers over file.
    Sources(sources::SourcesArgs),
}

fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Cdc(args) => cdc::run(args),
        BenchCommand::Cluster(args) => cluster::run(args),
        BenchCommand::Combine(args) => combine::run(args),
        BenchCommand::Failover(args) => failover::run(args),
        BenchCommand::Http(args) => http::run(args),
        BenchCommand::Iceberg(args) => iceberg::run(args),
        BenchCommand::Latency(args) => latency::run(args),
        BenchCommand::Loads(args) => loads::run(args),
        BenchCommand::Outputs(args) => outputs::run(args),
        BenchCommand::Postgres(args) => sql::run(args),
        BenchCommand::Mysql(args) => sql::run(args),
        BenchCommand::MysqlCdc(args) => cdc::run_with::<mysql_cdc::Mariadb>(args),
        BenchCommand::Scale(args) => scale::run(args),
        BenchCommand::Skew(args) => skew::run(args),
        BenchCommand::Sources(args) => sources::run(args),
    }
}
