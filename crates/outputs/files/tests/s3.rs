//! The files output on S3 (a bucket of each test's own on the local S3 server,
//! `.ci/services`): each transaction's batch is one object under its final name, a
//! restart reads the listing and discards what its generation already wrote, and an
//! object is never overwritten.

use serde_json::json;
use sluice_files_output::{Config, FilesEndpoint, Resource, parse_batch_file_name};
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Target,
};
use sluice_testkit::s3::{TestBucket, settings};

fn endpoint(bucket: &TestBucket, generation: Generation) -> FilesEndpoint {
    let config: Config = sluice_output_sdk::config::parse(&json!({
        "directory": bucket.url("out"),
        "s3": settings(),
    }))
    .unwrap();
    let resource = Resource {
        path: "views".into(),
    };
    let target = Target {
        materialization: "m".into(),
        resource: json!({"path": "views"}),
        format: Format::Json,
        header: None,
        generation,
        former_writers: false,
    };
    FilesEndpoint::new(&config, &resource, &target).unwrap()
}

fn generation() -> Generation {
    Generation {
        id: GenerationId::mint(),
        adopts_unstamped: false,
    }
}

/// Transaction `txn`'s batch of `lines`, written whole unless `end` is false (a crash
/// before `batch_end`).
async fn batch(e: &mut FilesEndpoint, txn: u64, lines: &[&str], end: bool) {
    e.batch_start(txn, BatchKind::Delta).await.unwrap();
    let mut buffer = Buffer::default();
    buffer.start(txn);
    for line in lines {
        buffer.push(b"", format!("{line}\n").as_bytes());
    }
    e.push(&buffer).await.unwrap();
    if end {
        e.batch_end().await.unwrap();
    }
}

/// `(txn, contents)` of every batch object of the binding, in name order.
async fn objects(bucket: &TestBucket) -> Vec<(u64, String)> {
    let store = bucket.store();
    let mut out = Vec::new();
    for key in store.list("out/views").await.unwrap() {
        let name = key.rsplit('/').next().unwrap();
        let file = parse_batch_file_name(name).unwrap_or_else(|| panic!("{key}"));
        let bytes = store.get(&key).await.unwrap().unwrap();
        out.push((file.txn, String::from_utf8(bytes.to_vec()).unwrap()));
    }
    out
}

#[tokio::test]
async fn a_restart_discards_the_transactions_whose_objects_exist_and_writes_the_rest() {
    let bucket = TestBucket::create("files-restart");
    let g = generation();
    let mut e = endpoint(&bucket, g);
    e.open().await.unwrap();
    batch(&mut e, 1, &["a"], true).await;
    batch(&mut e, 2, &["b", "c"], true).await;
    batch(&mut e, 3, &["d"], false).await; // cut short: nothing of it is visible
    drop(e);
    assert_eq!(
        objects(&bucket).await,
        vec![(1, "a\n".into()), (2, "b\nc\n".into())]
    );

    let mut e = endpoint(&bucket, g);
    e.open().await.unwrap();
    batch(&mut e, 2, &["replayed"], true).await; // in the listing: discarded
    batch(&mut e, 3, &["d"], true).await;
    assert_eq!(
        objects(&bucket).await,
        vec![(1, "a\n".into()), (2, "b\nc\n".into()), (3, "d\n".into())]
    );
}

#[tokio::test]
async fn a_batch_put_by_an_attempt_that_never_saw_it_return_is_kept_not_overwritten() {
    let bucket = TestBucket::create("files-put-twice");
    let g = generation();
    let mut first = endpoint(&bucket, g);
    first.open().await.unwrap();
    // Another attempt opened before the first one's put landed: its tail is stale.
    let mut second = endpoint(&bucket, g);
    second.open().await.unwrap();
    batch(&mut first, 1, &["first"], true).await;
    batch(&mut second, 1, &["second"], true).await;
    assert_eq!(objects(&bucket).await, vec![(1, "first\n".into())]);
}

#[tokio::test]
async fn another_generations_objects_are_not_this_ones_tail() {
    let bucket = TestBucket::create("files-generation");
    let mut old = endpoint(&bucket, generation());
    old.open().await.unwrap();
    batch(&mut old, 5, &["old"], true).await;

    let mut new = endpoint(&bucket, generation());
    new.open().await.unwrap();
    batch(&mut new, 1, &["new"], true).await;
    let txns: Vec<u64> = objects(&bucket).await.iter().map(|o| o.0).collect();
    assert_eq!(
        txns.len(),
        2,
        "a reset's generation writes transaction 1 again"
    );
    assert!(txns.contains(&1) && txns.contains(&5));
}

#[test]
fn s3_settings_errors_name_the_option() {
    let target = Target {
        materialization: "m".into(),
        resource: json!({"path": "views"}),
        format: Format::Json,
        header: None,
        generation: generation(),
        former_writers: false,
    };
    let resource = Resource {
        path: "views".into(),
    };
    for (config, names) in [
        (
            json!({"directory": "s3://bkt/out", "s3": {"access_key_id": "a"}}),
            "s3.secret_access_key",
        ),
        (json!({"directory": "/var/out", "s3": {}}), "`s3`"),
        (json!({"directory": "s3://BKT"}), "directory"),
    ] {
        let config: Config = sluice_output_sdk::config::parse(&config).unwrap();
        match FilesEndpoint::new(&config, &resource, &target) {
            Err(OutputError::Config(e)) => assert!(e.contains(names), "{e}"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("{names}: accepted"),
        }
    }
}
