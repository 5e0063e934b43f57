//! The reference memory driver: spec, validate, apply, strict and atomic commits, deletes,
//! checkpoint recovery over split ranges, and a state file shared by separate drivers.

mod common;

use common::{connect, spec, store, transaction};
use serde_json::json;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{self as m, constraint::Type};
use sluice_driver_sdk::{Driver, Error};
use sluice_memory::MemoryDriver;
use std::sync::Arc;

const MAT: &str = "acme/views";

fn views(endpoint: &str) -> flow::MaterializationSpec {
    spec(MAT, endpoint, &[("views", false), ("events", true)])
}

fn apply(spec: &flow::MaterializationSpec, dry_run: bool) -> m::ApplyRequest {
    m::ApplyRequest {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        dry_run,
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
    let (mut tx, mut rx, _) = connect(Arc::new(driver.clone()), &views("{}"), 0, 9)
        .await
        .unwrap();
    let first = vec![
        store(
            0,
            &[(b"a", r#"{"v":1}"#, false), (b"b", r#"{"v":2}"#, false)],
        ),
        store(1, &[(b"e", "1", false), (b"e", "2", false)]),
    ];
    transaction(&mut tx, &mut rx, b"cp1", first).await.unwrap();
    let second = vec![store(
        0,
        &[(b"a", r#"{"v":10}"#, true), (b"b", "null", true)],
    )];
    transaction(&mut tx, &mut rx, b"cp2", second).await.unwrap();
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
    let (mut tx, mut rx, _) = connect(Arc::new(driver.clone()), &views("{}"), 0, 9)
        .await
        .unwrap();
    transaction(
        &mut tx,
        &mut rx,
        b"cp1",
        vec![store(0, &[(b"a", "1", false)])],
    )
    .await
    .unwrap();
    let wrong = vec![store(0, &[(b"new", "2", false), (b"a", "3", false)])];
    let err = transaction(&mut tx, &mut rx, b"cp2", wrong)
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
    let (mut tx, mut rx, opened) = connect(driver.clone(), &spec, 0, u32::MAX).await.unwrap();
    assert!(opened.flow_checkpoint.is_empty());
    transaction(&mut tx, &mut rx, b"parent", vec![])
        .await
        .unwrap();

    let (mut tx, mut rx, opened) = connect(driver.clone(), &spec, 0, u32::MAX / 2)
        .await
        .unwrap();
    assert_eq!(opened.flow_checkpoint, b"parent");
    transaction(&mut tx, &mut rx, b"left", vec![])
        .await
        .unwrap();

    let (_, _, opened) = connect(driver.clone(), &spec, 0, u32::MAX / 4)
        .await
        .unwrap();
    assert_eq!(
        opened.flow_checkpoint, b"left",
        "narrowest covering range wins"
    );
    let (_, _, opened) = connect(driver, &spec, u32::MAX / 2 + 1, u32::MAX)
        .await
        .unwrap();
    assert_eq!(opened.flow_checkpoint, b"parent");
}

#[tokio::test]
async fn drivers_sharing_a_state_file_fence_each_other_and_persist_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let endpoint = json!({ "path": path }).to_string();
    let spec = views(&endpoint);
    // Two driver values share nothing in memory, like two processes.
    let (first, second) = (MemoryDriver::new(), MemoryDriver::new());
    let (mut old_tx, mut old_rx, _) = connect(Arc::new(first), &spec, 0, 9).await.unwrap();
    let (mut new_tx, mut new_rx, _) = connect(Arc::new(second), &spec, 0, 9).await.unwrap();

    let err = transaction(
        &mut old_tx,
        &mut old_rx,
        b"old",
        vec![store(0, &[(b"z", "0", false)])],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    transaction(
        &mut new_tx,
        &mut new_rx,
        b"new",
        vec![store(0, &[(b"k", r#"{"n":1}"#, false)])],
    )
    .await
    .unwrap();

    let rows = MemoryDriver::rows_in_file(&path, MAT, "views").unwrap();
    assert_eq!(rows, vec![(b"k".to_vec(), json!({"n": 1}))]);
    let (_, _, opened) = connect(Arc::new(MemoryDriver::new()), &spec, 0, 9)
        .await
        .unwrap();
    assert_eq!(
        opened.flow_checkpoint, b"new",
        "a third driver recovers the committed checkpoint"
    );
}
