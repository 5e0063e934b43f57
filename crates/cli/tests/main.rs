//! The `sluice` command's tests, end to end: each module runs the binary (and the
//! servers of this machine) as a user would. One test binary, not one per file: a
//! binary per file compiled the common kit and linked the dependency tree once per file.

mod airbyte;
mod apply;
mod bad_input;
mod check;
mod cluster;
mod cluster_apply;
mod cluster_autosplit;
mod cluster_cdc;
mod cluster_cdc_snapshot;
mod cluster_http;
mod cluster_iceberg;
mod cluster_iceberg_wiped;
mod cluster_load_move;
mod cluster_mysql_cdc;
mod cluster_output;
mod cluster_partitions;
mod common;
mod deletes;
mod docs;
mod driver_conformance;
mod examples;
mod external_current;
mod external_grpc;
mod health;
mod http;
mod iceberg;
mod iceberg_memory;
mod kafka;
mod key_defaults;
mod loads;
mod metrics;
mod nats;
mod outputs;
mod pause;
mod pipeline_e2e;
mod postgres_cdc;
mod produce;
mod progress;
mod protocol_current;
mod recreated_store;
mod redaction;
mod redis;
mod reductions;
mod restore;
mod run_errors;
mod shards;
mod status;
mod status_tls;
mod tools;
// `sluice torture` drives the fail points compiled in by this feature.
#[cfg(feature = "failpoints")]
mod torture;
mod torture_cluster_singletons;
mod workers;
