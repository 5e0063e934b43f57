//! Exactly-once under faults: each test runs one `sluice torture` scenario, bounded
//! (small inputs, few faults), and checks what it reports: every fault fired, no run
//! ended otherwise than its fault says, and the store equals the reduction computed
//! independently by the torture (lost = duplicated = mismatched = 0).
//!
//! `sluice torture` runs the `sluice-torture` binary beside it, which drives this
//! `sluice`: it needs fail points, and both binaries built, as the README's test command
//! builds them (`cargo build --workspace --all-features --bins` before `cargo nextest run
//! --workspace --all-features`; this file is only built
//! with the `failpoints` feature). PostgreSQL and MariaDB scenarios use a
//! schema (PostgreSQL) or database (MariaDB) of their own in the shared server (dropped
//! after), except `server-restart`, which starts a private server in a temporary folder.
//! Kafka and NATS inputs always live in a private broker the torture starts (tansu,
//! nats-server), never the shared one. The Iceberg upsert test writes to a bucket of its
//! own on the local S3 server (moto on 127.0.0.1:9000, which `.ci/services` starts).
//!
//! Outputs (`--output`) are checked batch by batch besides the final comparison: a
//! destination tampered with mid-torture must fail it, each broken rule named.

use crate::common;

use common::SLUICE;
use common::torture::{assert_exact_after, assert_fired, stdout, torture};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sqlite_random_crashes_lose_and_double_nothing() {
    assert_exact_after(&torture(&["--store", "sqlite", "--faults", "8"]), 8);
}

#[test]
fn sqlite_delta_random_crashes_store_each_transaction_and_key_once() {
    let out = torture(&["--store", "sqlite", "--mode", "delta", "--faults", "8"]);
    let [_, _, expected, ..] = assert_exact_after(&out, 8);
    assert!(expected > 300, "delta rows are per transaction and key");
}

#[test]
fn postgres_random_crashes_lose_and_double_nothing() {
    assert_exact_after(&torture(&["--store", "postgres", "--faults", "8"]), 8);
}

#[test]
fn postgres_delta_random_crashes_store_each_transaction_and_key_once() {
    let out = torture(&["--store", "postgres", "--mode", "delta", "--faults", "8"]);
    assert_exact_after(&out, 8);
}

#[test]
fn mysql_random_crashes_lose_and_double_nothing() {
    assert_exact_after(&torture(&["--store", "mysql", "--faults", "8"]), 8);
}

#[test]
fn mysql_delta_random_crashes_store_each_transaction_and_key_once() {
    let out = torture(&["--store", "mysql", "--mode", "delta", "--faults", "8"]);
    let [_, _, expected, ..] = assert_exact_after(&out, 8);
    assert!(expected > 300, "delta rows are per transaction and key");
}

#[test]
fn sqlite_zombie_is_fenced_at_its_next_commit() {
    let out = torture(&["--store", "sqlite", "--scenario", "zombie"]);
    assert_exact_after(&out, 1);
    assert!(stdout(&out).contains("fenced off"), "{}", stdout(&out));
}

#[test]
fn postgres_zombie_is_fenced_at_its_next_commit() {
    let out = torture(&["--store", "postgres", "--scenario", "zombie"]);
    assert_exact_after(&out, 1);
    assert!(stdout(&out).contains("fenced off"), "{}", stdout(&out));
}

#[test]
fn mysql_zombie_is_fenced_at_its_next_commit() {
    let out = torture(&["--store", "mysql", "--scenario", "zombie"]);
    assert_exact_after(&out, 1);
    assert!(stdout(&out).contains("fenced off"), "{}", stdout(&out));
}

#[test]
fn stdio_driver_killed_mid_run_is_restarted_and_ends_exact() {
    let out = torture(&["--store", "sqlite", "--scenario", "driver-dies"]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 3, "the runtime reopened the driver");
}

#[test]
fn grpc_driver_killed_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--scenario",
        "driver-dies",
        "--transport",
        "grpc",
    ]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 3, "the runtime reconnected");
}

#[test]
fn mysql_stdio_driver_killed_mid_run_is_restarted_and_ends_exact() {
    let out = torture(&["--store", "mysql", "--scenario", "driver-dies"]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 3, "the runtime reopened the driver");
}

#[test]
fn mysql_grpc_driver_killed_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&[
        "--store",
        "mysql",
        "--scenario",
        "driver-dies",
        "--transport",
        "grpc",
    ]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 3, "the runtime reconnected");
}

#[test]
fn postgres_server_restarted_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&["--store", "postgres", "--scenario", "server-restart"]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 1, "the pipeline reconnected");
}

#[test]
fn recovery_log_fsync_error_stops_clearly_and_acknowledges_nothing_undurable() {
    let out = torture(&["--store", "sqlite", "--scenario", "disk-full"]);
    assert_exact_after(&out, 2);
    let text = stdout(&out);
    assert!(text.contains("no space left on device"), "{text}");
}

#[test]
fn mysql_server_restarted_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&["--store", "mysql", "--scenario", "server-restart"]);
    let [_, restarts, ..] = assert_exact_after(&out, 3);
    assert!(restarts >= 1, "the pipeline reconnected");
}

#[test]
fn kafka_random_crashes_lose_and_double_nothing() {
    let out = torture(&["--store", "sqlite", "--source", "kafka", "--faults", "8"]);
    assert_exact_after(&out, 8);
}

/// Clients that retry with their Idempotency-Keys after each SIGKILL of the server:
/// every body, acknowledged before a kill or only after its retries, is stored once.
#[test]
fn http_clients_retrying_across_kills_store_every_body_once() {
    let out = torture(&["--store", "sqlite", "--source", "http", "--faults", "8"]);
    assert_exact_after(&out, 8);
}

#[test]
fn nats_random_crashes_lose_and_double_nothing() {
    let out = torture(&["--store", "sqlite", "--source", "nats", "--faults", "8"]);
    assert_exact_after(&out, 8);
}

/// SIGKILLs and fail points during the backfill of a table (the first run snapshots
/// it) and during streaming (later segments are inserted and streamed).
#[test]
fn postgres_cdc_random_crashes_lose_and_double_nothing() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--source",
        "postgres_cdc",
        "--faults",
        "8",
    ]);
    assert_exact_after(&out, 8);
}

/// The same for `mysql_cdc`: a private MariaDB with the binary log on, its table
/// snapshotted in chunks, then streamed as a replica.
#[test]
fn mysql_cdc_random_crashes_lose_and_double_nothing() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--source",
        "mysql_cdc",
        "--faults",
        "8",
    ]);
    assert_exact_after(&out, 8);
}

#[test]
fn postgres_cdc_delta_is_refused_naming_why() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--source",
        "postgres_cdc",
        "--mode",
        "delta",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--source postgres_cdc runs the random scenario in standard mode"),
        "{err}"
    );
}

#[test]
fn nats_delta_random_crashes_store_each_transaction_and_key_once() {
    let out = torture(&[
        "--store", "sqlite", "--source", "nats", "--mode", "delta", "--faults", "4",
    ]);
    let [_, _, expected, ..] = assert_exact_after(&out, 4);
    assert!(expected > 300, "delta rows are per transaction and key");
}

#[test]
fn kafka_broker_restarted_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--source",
        "kafka",
        "--scenario",
        "broker-restart",
        "--faults",
        "4",
    ]);
    assert_exact_after(&out, 4);
    assert!(stdout(&out).contains("tansu restarted"), "{}", stdout(&out));
}

#[test]
fn nats_broker_restarted_mid_run_is_reconnected_and_ends_exact() {
    let out = torture(&[
        "--store",
        "sqlite",
        "--source",
        "nats",
        "--scenario",
        "broker-restart",
        "--faults",
        "4",
    ]);
    assert_exact_after(&out, 4);
    assert!(stdout(&out).contains("NATS restarted"), "{}", stdout(&out));
}

#[test]
fn kafka_delta_is_refused_naming_why() {
    let out = torture(&["--store", "sqlite", "--source", "kafka", "--mode", "delta"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("four partitions in no fixed order"),
        "{stderr}"
    );
}

#[test]
fn iceberg_random_crashes_append_each_transaction_and_key_once_with_no_orphans() {
    // Fail points include the sink's own mid-apply; the table is read back by pyiceberg,
    // and a data file no snapshot references is an anomaly.
    let out = torture(&["--store", "iceberg", "--mode", "delta", "--faults", "20"]);
    assert_exact_after(&out, 20);
}

#[test]
fn iceberg_upsert_on_s3_random_crashes_leave_one_row_per_key_equal_to_the_model() {
    // `mode: upsert` on moto's S3 server, its input with deletions: pyiceberg's scan must
    // hold one row per key, the deleted keys absent, every row's columns its document's,
    // and no data file unreferenced. `sluice maintain` runs between runs every 3 faults:
    // the rows read before and after each must be equal.
    let bucket = sluice_testkit::s3::TestBucket::create("torture-iceberg-upsert");
    let endpoint = format!("http://{}", sluice_testkit::s3::LOCAL_S3);
    let out = torture(&[
        "--store",
        "iceberg",
        "--mode",
        "standard",
        "--faults",
        "8",
        "--s3",
        &bucket.url("torture"),
        "--s3-endpoint",
        &endpoint,
        "--maintain-every",
        "3",
    ]);
    let [_, _, expected, ..] = assert_exact_after(&out, 8);
    assert!(
        stdout(&out).contains("sluice maintain: "),
        "maintenance ran: {}",
        stdout(&out)
    );
    assert!(
        expected < 300,
        "some of the 300 keys end deleted: {expected} rows"
    );
}

#[test]
fn iceberg_refuses_an_input_without_order_naming_why() {
    let out = torture(&["--store", "iceberg", "--source", "kafka", "--faults", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--store iceberg reads a file or a NATS stream"),
        "{stderr}"
    );
}

#[test]
fn files_output_random_crashes_publish_each_transaction_once() {
    let out = torture(&["--output", "files", "--faults", "10"]);
    assert_exact_after(&out, 10);
    let faults = stdout(&out);
    assert!(
        faults.contains("output::"),
        "output fail points armed:\n{faults}"
    );
}

/// The topic (4 partitions, over which each transaction's messages spread by key)
/// lives in a private tansu the torture starts. Fewer documents than elsewhere: tansu
/// reads a topic back in time that grows faster than its length (9 000 messages: 30 s).
#[test]
fn kafka_output_random_crashes_publish_each_transaction_once() {
    let out = torture(&["--output", "kafka", "--docs", "1600", "--faults", "6"]);
    assert_exact_after(&out, 6);
}

/// The subject lives in a private nats-server the torture starts.
#[test]
fn nats_output_random_crashes_publish_each_transaction_once() {
    let out = torture(&["--output", "nats", "--faults", "10"]);
    assert_exact_after(&out, 10);
}

#[test]
fn output_delta_is_refused_naming_why() {
    let out = torture(&["--output", "files", "--mode", "delta"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("it refuses delta updates"), "{stderr}");
}

/// The name of transaction `txn`'s batch file in `folder`, if it is there (the files
/// output's naming: `<generation>-<txn:020>.jsonl`; a torture writes one generation).
fn batch_file(folder: &Path, txn: u64) -> Option<String> {
    std::fs::read_dir(folder)
        .ok()?
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .find(|name| {
            sluice_files_output::parse_batch_file_name(name)
                .is_some_and(|f| f.txn == txn && f.kind == sluice_output_sdk::BatchKind::Delta)
        })
}

/// Waits until `folder` holds the batch files of transactions 1..=`txns`.
fn await_batches(folder: &Path, txns: u64) {
    let started = Instant::now();
    while !(1..=txns).all(|txn| batch_file(folder, txn).is_some()) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no {txns} batch files in {}",
            folder.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Files published by a running torture are tampered with (a transaction published
/// twice, one removed, a delete's document changed): the torture must fail, naming
/// each broken rule.
#[test]
fn a_tampered_files_output_fails_the_torture_naming_each_broken_rule() {
    let mut child = Command::new(SLUICE)
        .args([
            "torture", "--output", "files", "--docs", "3000", "--keys", "300",
        ])
        .args(["--txn-docs", "100", "--seed", "11", "--faults", "12"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice torture");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let dir = PathBuf::from(first.trim().rsplit_once(" in ").expect("its folder").1);
    let folder = dir.join("output/torture_events");
    await_batches(&folder, 5);

    let file = |txn| folder.join(batch_file(&folder, txn).unwrap());
    let second = batch_file(&folder, 2).unwrap();
    std::fs::copy(
        folder.join(&second),
        folder.join(second.replace(".jsonl", ".snapshot.jsonl")),
    )
    .unwrap();
    std::fs::remove_file(file(4)).unwrap();
    let third = file(3);
    let text = std::fs::read_to_string(&third).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let delete = lines.iter().position(|l| l.starts_with(r#"{"delete""#));
    let delete = delete.expect("transaction 3 updates a key");
    let mut record: serde_json::Value = serde_json::from_str(&lines[delete]).unwrap();
    record["delete"]["views"] = serde_json::json!(1_000_000);
    lines[delete] = record.to_string();
    std::fs::write(&third, lines.join("\n") + "\n").unwrap();

    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "the torture passed:\n{stderr}");
    for rule in [
        "anomaly (output rule broken): files-output: transaction 2 is published 2 times",
        "anomaly (output rule broken): files-output: transactions 4..=4 are missing between 3 and 5",
        &format!(
            "anomaly (output rule broken): files-output: transaction 3 message {delete}: the delete of "
        ),
    ] {
        assert!(stderr.contains(rule), "{rule:?} not reported:\n{stderr}");
    }
}

#[test]
fn postgres_cluster_members_killed_stopped_split_and_etcd_restarted_end_exact() {
    let out = torture(&[
        "--store",
        "postgres",
        "--scenario",
        "cluster",
        "--faults",
        "8",
    ]);
    assert_exact_after(&out, 8);
    let kinds = [
        "cluster: member SIGKILLed",
        "cluster: zombie past its lease",
        "cluster: shard split",
        "cluster: etcd restarted",
    ];
    assert_fired(&out, &kinds, 2);
}
