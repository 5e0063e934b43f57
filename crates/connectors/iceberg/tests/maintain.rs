//! Table maintenance (`sluice_iceberg::maintain`, what `sluice maintain` runs): many
//! small epochs into an upsert table and a change log, then compaction, expiry and
//! orphan removal. The rows read back (by pyiceberg for the upsert view) are equal
//! before and after, data files are fewer, delete files gone, snapshots expired; the
//! sink's next epochs, a descriptor applied again and a decided epoch applied after a
//! crash still commit exactly once; fabricated orphans older than the age are removed,
//! fresh ones and the sink's uncommitted staging kept; a maintenance loop racing a
//! running sink changes no row.
//!
//! Needs `python3` with `pyiceberg[sql-sqlite,pyarrow]` (`.ci/services` installs it),
//! and the local S3 server for the S3 test.

mod common;

use common::upsert::{self, Model, apply, pyiceberg_view};
use common::{Fixture, binding, epoch, rows};
use serde_json::{Value, json};
use sluice_iceberg::IcebergSink;
use sluice_iceberg::maintain::{self, Options, TableReport};
use sluice_sink_sdk::{Decided, EpochSink, Recovery};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Epoch `n`'s changes: keys `n % 7 .. +4` upserted as `v<n>`, key `(n * 3) % 10`
/// deleted (unless upserted too).
fn changes(n: u64) -> Vec<(i64, Option<String>)> {
    let mut out: Vec<(i64, Option<String>)> = (0..4)
        .map(|i| (((n % 7) + i) as i64, Some(format!("v{n}"))))
        .collect();
    let gone = ((n * 3) % 10) as i64;
    if out.iter().all(|c| c.0 != gone) {
        out.push((gone, None));
    }
    out
}

/// Epoch `n` of [`changes`] up to its decision.
async fn decide(sink: &mut IcebergSink, n: u64) -> Value {
    upsert::decide(sink, n, &changes(n)).await
}

/// Epoch `n` whole, into `model` too.
async fn upsert_epoch(sink: &mut IcebergSink, n: u64, model: &mut Model) -> Value {
    let d = upsert::epoch(sink, n, &changes(n)).await;
    apply(model, &changes(n));
    d
}

/// What Load answers for keys 0..12.
async fn loaded(sink: &mut IcebergSink) -> Model {
    upsert::loaded(sink, 0..12).await
}

/// Everything expired and removed at once: the tests' settings.
fn eager() -> Options {
    Options {
        keep_snapshots: 2,
        snapshot_age: Duration::ZERO,
        orphan_age: Duration::ZERO,
        ..Options::default()
    }
}

async fn maintain(f: &Fixture, table: &str, options: &Options) -> TableReport {
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), f.warehouse_location())
        .await
        .unwrap();
    let ident = maintain::table_ident("sluice", table).unwrap();
    maintain::maintain_table(&catalog, &ident, options, &mut |_| {})
        .await
        .unwrap()
}

fn snapshot_count(f: &Fixture, table: &str) -> usize {
    sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        f.warehouse_location(),
        &format!("sluice.{table}"),
        true,
    )
    .unwrap()
    .len()
}

#[tokio::test]
async fn maintaining_an_upsert_table_keeps_its_view_and_the_sink_goes_on_exactly_once() {
    let f = Fixture::new();
    let state = f.dir.path().join("state");
    let mut s = upsert::sink(&f, &state).await;
    s.recover(&Recovery::default()).await.unwrap();
    let mut model = Model::new();
    for n in 1..=12 {
        upsert_epoch(&mut s, n, &mut model).await;
    }
    assert_eq!(pyiceberg_view(&f), model);

    let report = maintain(&f, "views", &eager()).await;
    assert!(report.data_files_before >= 12, "{report:?}");
    assert!(report.delete_files_before > 0, "{report:?}");
    assert_eq!(report.data_files_after, 1, "{report:?}");
    assert_eq!(report.delete_files_after, 0, "{report:?}");
    assert_eq!(
        report.snapshots_expired, 11,
        "the compaction's and its parent kept: {report:?}"
    );
    assert_eq!(snapshot_count(&f, "views"), 2);
    assert_eq!(pyiceberg_view(&f), model, "after maintenance");

    // The running sink's index reflects a snapshot gone: its next epoch's deletes name
    // compacted-away rows (rebased at commit), then the index rebuilds.
    upsert_epoch(&mut s, 13, &mut model).await;
    assert_eq!(pyiceberg_view(&f), model, "the epoch after maintenance");
    assert_eq!(
        common::orphans(&f).await,
        Vec::<String>::new(),
        "the staged deletes the rebase replaced are removed"
    );
    assert_eq!(loaded(&mut s).await, model);
    let d14 = upsert_epoch(&mut s, 14, &mut model).await;
    assert_eq!(pyiceberg_view(&f), model);

    // Epoch 15 decided, then a crash; maintenance runs twice before the restart
    // applies the descriptor.
    let d15 = decide(&mut s, 15).await;
    drop(s);
    maintain(&f, "views", &eager()).await;
    let report = maintain(&f, "views", &eager()).await;
    assert_eq!(report.data_files_after, 1, "{report:?}");
    let mut s = upsert::sink(&f, &state).await;
    let recovery = Recovery {
        decided: Some(Decided {
            epoch: 15,
            descriptor: d15,
        }),
        ..Default::default()
    };
    s.recover(&recovery).await.unwrap();
    apply(&mut model, &changes(15));
    assert_eq!(pyiceberg_view(&f), model, "the decided epoch, once");
    assert_eq!(loaded(&mut s).await, model);
    // An older descriptor applied again (its snapshot expired; the compaction carries
    // the transaction) changes nothing.
    s.commit_epoch(14, &d14).await.unwrap();
    upsert_epoch(&mut s, 16, &mut model).await;
    assert_eq!(pyiceberg_view(&f), model);
    assert_eq!(loaded(&mut s).await, model);
}

/// `(id, _txn, _op)` of `n` epochs of a change log: keys `n % 5`, `n % 5 + 1`.
fn changelog_rows(n: u64) -> Vec<(i64, Option<&'static str>, &'static str)> {
    let k = (n % 5) as i64;
    vec![
        (k, Some("a"), "U"),
        (k + 1, None, if n.is_multiple_of(2) { "D" } else { "U" }),
    ]
}

async fn changelog_maintenance(f: &Fixture) {
    let bindings = [binding("events")];
    let mut s = f.sink(json!({}), &bindings).await;
    s.recover(&Recovery::default()).await.unwrap();
    let mut descriptors = Vec::new();
    for n in 1..=10 {
        descriptors.push(epoch(&mut s, n, &changelog_rows(n)).await.unwrap());
    }
    let before = rows(f, "events").await;
    assert_eq!(before.len(), 20);

    let report = maintain(f, "events", &eager()).await;
    assert_eq!(
        (report.data_files_before, report.data_files_after),
        (10, 1),
        "{report:?}"
    );
    assert_eq!(report.snapshots_expired, 9, "{report:?}");
    assert_eq!(rows(f, "events").await, before, "after maintenance");
    let theirs = sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        f.warehouse_location(),
        "sluice.events",
        false,
    )
    .unwrap();
    let mut theirs: Vec<_> = theirs
        .iter()
        .map(|r| common::id_txn_op(r.as_object().unwrap()))
        .collect();
    theirs.sort();
    assert_eq!(theirs, before, "pyiceberg after maintenance");

    // Descriptors applied again, their snapshots expired: the compaction snapshot says
    // the table holds them.
    s.commit_epoch(10, &descriptors[9]).await.unwrap();
    s.commit_epoch(3, &descriptors[2]).await.unwrap();
    epoch(&mut s, 11, &changelog_rows(11)).await.unwrap();
    let after = rows(f, "events").await;
    assert_eq!(after.len(), 22, "epoch 11 once, nothing else again");
    assert_eq!(common::orphans(f).await, Vec::<String>::new());
}

#[tokio::test]
async fn maintaining_a_change_log_keeps_its_rows_and_its_transactions() {
    changelog_maintenance(&Fixture::new()).await;
}

#[tokio::test]
async fn maintaining_a_change_log_on_s3_keeps_its_rows() {
    changelog_maintenance(&Fixture::s3("maintain")).await;
}

#[tokio::test]
async fn orphans_older_than_the_age_go_and_fresh_ones_and_uncommitted_staging_stay() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut s = f.sink(json!({}), &bindings).await;
    s.recover(&Recovery::default()).await.unwrap();
    let d = epoch(&mut s, 1, &changelog_rows(1)).await.unwrap();
    epoch(&mut s, 2, &changelog_rows(2)).await.unwrap();
    let staged = d["epochs"][0]["files"][0]["path"].as_str().unwrap();
    let folder = staged
        .rsplit_once('/')
        .unwrap()
        .0
        .strip_prefix("file://")
        .unwrap();
    let (attempt, epoch_folder) = folder.rsplit_once('/').unwrap();
    let generation = epoch_folder.split_once('-').unwrap().0;
    let table = f.warehouse().join("sluice.db/events");
    let write = |path: std::path::PathBuf| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"left by an attempt cut short").unwrap();
        path
    };
    let stale_metadata = write(table.join("metadata/00099-cut-short.metadata.json"));
    let stale_manifest = write(table.join("metadata/snap-1-cut-short.avro"));
    let stale_staged = write(Path::new(folder).join("b0-cut-short.parquet"));
    let uncommitted = write(Path::new(attempt).join(format!("{generation}-3/b0-decided.parquet")));

    // Younger than the age: kept.
    let report = maintain(
        &f,
        "events",
        &Options {
            orphan_age: Duration::from_secs(3600),
            ..eager()
        },
    )
    .await;
    assert_eq!(report.orphans_removed, 0, "{report:?}");
    assert!(stale_metadata.exists() && stale_staged.exists());

    let report = maintain(&f, "events", &eager()).await;
    assert_eq!(report.orphans_removed, 3, "{report:?}");
    for gone in [&stale_metadata, &stale_manifest, &stale_staged] {
        assert!(!gone.exists(), "{}", gone.display());
    }
    assert!(
        uncommitted.exists(),
        "staging of an epoch above the last commit is the sink's"
    );
    assert_eq!(rows(&f, "events").await.len(), 4);
}

#[tokio::test]
async fn maintenance_racing_a_running_upsert_sink_changes_no_row() {
    let f = Fixture::new();
    let state = f.dir.path().join("state");
    let mut s = upsert::sink(&f, &state).await;
    s.recover(&Recovery::default()).await.unwrap();
    let mut model = Model::new();
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), f.warehouse_location())
        .await
        .unwrap();
    let ident = maintain::table_ident("sluice", "views").unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            // Orphans only past the default age: a commit in flight is never one.
            let options = Options {
                snapshot_age: Duration::ZERO,
                ..Options::default()
            };
            let mut runs = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                maintain::maintain_table(&catalog, &ident, &options, &mut |_| {})
                    .await
                    .unwrap();
                runs += 1;
            }
            runs
        })
    };
    for n in 1..=30 {
        upsert_epoch(&mut s, n, &mut model).await;
        tokio::task::yield_now().await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = racing.await.unwrap();
    assert!(runs > 0);
    assert_eq!(pyiceberg_view(&f), model);
    assert_eq!(loaded(&mut s).await, model);
}

#[tokio::test]
async fn automatic_maintenance_runs_after_every_n_commits() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let maintenance = json!({"maintenance": {"every": 4, "keep_snapshots": 2,
        "snapshot_age": "0s", "orphan_age": "0s", "target_file_size": "1MiB"}});
    let mut s = f.sink(maintenance, &bindings).await;
    s.recover(&Recovery::default()).await.unwrap();
    for n in 1..=3 {
        epoch(&mut s, n, &changelog_rows(n)).await.unwrap();
    }
    assert_eq!(snapshot_count(&f, "events"), 3, "not yet due");
    epoch(&mut s, 4, &changelog_rows(4)).await.unwrap();
    assert_eq!(
        snapshot_count(&f, "events"),
        2,
        "compacted, all but its parent expired"
    );
    assert_eq!(rows(&f, "events").await.len(), 8);
    assert_eq!(common::orphans(&f).await, Vec::<String>::new());

    for bad in [
        json!({"every": 0}),
        json!({"keep_snapshots": 1}),
        json!({"orphan_age": "1x"}),
    ] {
        let endpoint = f.endpoint(json!({ "maintenance": bad }));
        assert!(IcebergSink::new(&endpoint).is_err(), "{bad}");
    }
    let unknown = json!({"maintenance": {"evry": 3}});
    let err = IcebergSink::new(&f.endpoint(unknown))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("evry"), "{err}");
}
