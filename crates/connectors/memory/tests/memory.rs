//! The reference memory driver: spec, validate, apply, strict and atomic commits, deletes,
//! checkpoint recovery over split ranges, and a state file shared by separate drivers.

use serde_json::json;
use sluice_conformance::messages::{open, spec, store};
use sluice_conformance::{Capabilities, Session, assert_all_pass, run_suite};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize::{self as m, constraint::Type};
use sluice_driver_sdk::{Driver, Error};
use sluice_memory::MemoryDriver;
use std::sync::Arc;

const MAT: &str = "acme/views";

fn views(endpoint: &str) -> flow::MaterializationSpec {
    spec(MAT, endpoint, &[("views", false), ("events", true)])
}

use sluice_conformance::messages::apply_request as apply;

/// A session of `spec` over `[key_begin, key_end]` on `driver`, in process.
async fn connect(
    driver: Arc<dyn Driver>,
    spec: &flow::MaterializationSpec,
    key_begin: u32,
    key_end: u32,
) -> sluice_driver_sdk::Result<Session> {
    let endpoint = InProcess::new("memory", driver);
    Session::open(&endpoint, open(spec, key_begin, key_end)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_in_memory_and_in_a_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = InProcess::new("memory", Arc::new(MemoryDriver::new()));
    let configs = [json!({}), json!({ "path": dir.path().join("state.json") })];
    for config in configs {
        let results = run_suite(&endpoint, Capabilities::ALL, config, json!({"table": "t"})).await;
        assert_all_pass(&results);
    }
}

#[tokio::test]
async fn spec_returns_json_schemas() {
    let spec = MemoryDriver::new().spec(Default::default()).await.unwrap();
    let endpoint: serde_json::Value =
        serde_json::from_str(&spec.endpoint_spec_schema_json).unwrap();
    let resource: serde_json::Value =
        serde_json::from_str(&spec.resource_spec_schema_json).unwrap();
    assert_eq!(endpoint["properties"]["path"]["type"], "string");
    assert_eq!(resource["required"], json!(["table"]));
}

#[tokio::test]
async fn validate_requires_key_locations_and_the_document() {
    let projection = |field: &str, ptr: &str, key: bool| flow::Projection {
        field: field.into(),
        ptr: ptr.into(),
        is_primary_key: key,
        ..Default::default()
    };
    let collection = flow::CollectionSpec {
        key_ptrs: vec!["/id".into()],
        projections: vec![
            projection("id", "/id", true),
            projection("flow_document", "", false),
            projection("n", "/n", false),
        ],
        ..Default::default()
    };
    let req = m::ValidateRequest {
        materialization: MAT.into(),
        bindings: vec![m::validate_request::Binding {
            resource_spec_json: r#"{"table":"views"}"#.into(),
            collection: Some(collection),
            ..Default::default()
        }],
        ..Default::default()
    };
    let resp = MemoryDriver::new().validate(req.clone()).await.unwrap();
    let b = &resp.bindings[0];
    let kind = |f: &str| b.constraints[f].r#type;
    assert_eq!(kind("id"), Type::LocationRequired as i32);
    assert_eq!(kind("flow_document"), Type::FieldRequired as i32);
    assert_eq!(kind("n"), Type::FieldOptional as i32);
    assert_eq!(
        (b.resource_path.clone(), b.delta_updates),
        (vec!["views".to_string()], false)
    );

    let mut bad = req;
    bad.bindings[0].resource_spec_json = r#"{"tabel":"views"}"#.into();
    let err = MemoryDriver::new().validate(bad).await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("tabel")),
        "{err}"
    );
}

#[tokio::test]
async fn apply_dry_run_changes_nothing_and_apply_is_idempotent() {
    let driver = MemoryDriver::new();
    let spec = views("{}");
    let described = "create table events\ncreate table views";
    for dry_run in [true, true, false] {
        let resp = driver.apply_upsert(apply(&spec, dry_run)).await.unwrap();
        assert_eq!(resp.action_description, described, "dry_run={dry_run}");
    }
    let again = driver.apply_upsert(apply(&spec, false)).await.unwrap();
    assert_eq!(again.action_description, "", "nothing left to do");
    let dropped = driver.apply_delete(apply(&spec, false)).await.unwrap();
    assert_eq!(
        dropped.action_description,
        "drop table events\ndrop table views"
    );
}

#[tokio::test]
async fn updates_deletes_and_delta_appends_apply_at_commit() {
    let driver = MemoryDriver::new();
    let mut session = connect(Arc::new(driver.clone()), &views("{}"), 0, 9)
        .await
        .unwrap();
    let first = vec![
        store(
            0,
            &[(b"a", r#"{"v":1}"#, false), (b"b", r#"{"v":2}"#, false)],
        ),
        store(1, &[(b"e", "1", false), (b"e", "2", false)]),
    ];
    session.transaction(vec![], b"cp1", first).await.unwrap();
    let second = vec![store(
        0,
        &[(b"a", r#"{"v":10}"#, true), (b"b", "null", true)],
    )];
    session.transaction(vec![], b"cp2", second).await.unwrap();
    assert_eq!(
        driver.rows(MAT, "views"),
        vec![(b"a".to_vec(), json!({"v": 10}))]
    );
    assert_eq!(
        driver.rows(MAT, "events"),
        vec![(b"e".to_vec(), json!(1)), (b"e".to_vec(), json!(2))]
    );
}

#[tokio::test]
async fn commit_with_a_wrong_exists_flag_fails_and_writes_nothing() {
    let driver = MemoryDriver::new();
    let mut session = connect(Arc::new(driver.clone()), &views("{}"), 0, 9)
        .await
        .unwrap();
    session
        .transaction(vec![], b"cp1", vec![store(0, &[(b"a", "1", false)])])
        .await
        .unwrap();
    let wrong = vec![store(0, &[(b"new", "2", false), (b"a", "3", false)])];
    let err = session
        .transaction(vec![], b"cp2", wrong)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("stored with exists=false but the row exists"),
        "{err}"
    );
    assert_eq!(
        driver.rows(MAT, "views"),
        vec![(b"a".to_vec(), json!(1))],
        "all or nothing"
    );
    assert_eq!(driver.checkpoint(MAT, 0, 9).unwrap(), b"cp1");
}

#[tokio::test]
async fn a_split_range_recovers_the_narrowest_covering_checkpoint() {
    let driver: Arc<dyn Driver> = Arc::new(MemoryDriver::new());
    let spec = views("{}");
    let mut session = connect(driver.clone(), &spec, 0, u32::MAX).await.unwrap();
    assert!(session.recovered().is_empty());
    session
        .transaction(vec![], b"parent", vec![])
        .await
        .unwrap();

    let mut session = connect(driver.clone(), &spec, 0, u32::MAX / 2)
        .await
        .unwrap();
    assert_eq!(session.recovered(), b"parent");
    session.transaction(vec![], b"left", vec![]).await.unwrap();

    let opened = connect(driver.clone(), &spec, 0, u32::MAX / 4)
        .await
        .unwrap();
    assert_eq!(opened.recovered(), b"left", "narrowest covering range wins");
    let opened = connect(driver, &spec, u32::MAX / 2 + 1, u32::MAX)
        .await
        .unwrap();
    assert_eq!(opened.recovered(), b"parent");
}

#[tokio::test]
async fn drivers_sharing_a_state_file_fence_each_other_and_persist_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let endpoint = json!({ "path": path }).to_string();
    let spec = views(&endpoint);
    // Two driver values share nothing in memory, like two processes.
    let (first, second) = (MemoryDriver::new(), MemoryDriver::new());
    let mut old = connect(Arc::new(first), &spec, 0, 9).await.unwrap();
    let mut new = connect(Arc::new(second), &spec, 0, 9).await.unwrap();

    let err = old
        .transaction(vec![], b"old", vec![store(0, &[(b"z", "0", false)])])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    new.transaction(
        vec![],
        b"new",
        vec![store(0, &[(b"k", r#"{"n":1}"#, false)])],
    )
    .await
    .unwrap();

    let rows = MemoryDriver::rows_in_file(&path, MAT, "views").unwrap();
    assert_eq!(rows, vec![(b"k".to_vec(), json!({"n": 1}))]);
    let opened = connect(Arc::new(MemoryDriver::new()), &spec, 0, 9)
        .await
        .unwrap();
    assert_eq!(
        opened.recovered(),
        b"new",
        "a third driver recovers the committed checkpoint"
    );
}

/// Which thread touches the state file: the blocking pool, never the runtime's worker.
/// On a current-thread runtime (one worker for every task), an Open waiting for the
/// file's lock, held by another process, must leave the worker free to run the task
/// that releases it; waiting on the worker, it would never return.
#[tokio::test(flavor = "current_thread")]
async fn an_open_waiting_for_the_state_files_lock_leaves_a_current_thread_runtime_free() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let spec = views(&json!({ "path": path }).to_string());
    MemoryDriver::new()
        .apply_upsert(apply(&spec, false))
        .await
        .unwrap();
    // What another process sharing the file holds while it commits.
    let holder = std::fs::File::create(path.with_extension("lock")).unwrap();
    holder.lock().unwrap();
    let opening = tokio::spawn(async move {
        connect(Arc::new(MemoryDriver::new()), &spec, 0, u32::MAX)
            .await
            .map(drop)
    });
    // The Open starts and waits for the lock; this task runs again (and releases the
    // lock) only if that wait does not hold the runtime's one worker.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    holder.unlock().unwrap();
    opening
        .await
        .unwrap()
        .expect("the Open takes the lock once it is released");
}
