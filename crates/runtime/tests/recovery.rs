//! The recovery log: durability across reopen, torn tails, one writer, compaction, and
//! the recovery decision table.

use serde_json::json;
use sluice_runtime::recovery::{
    Checkpoint, Intent, RecoveryError, RecoveryLog, RecoveryPlan, inspect, plan_recovery,
};
use sluice_source_sdk::Resume;
use std::collections::BTreeMap;
use std::io::Write;

fn checkpoint(txn: u64) -> Checkpoint {
    Checkpoint {
        txn,
        sources: BTreeMap::from([("views".to_string(), json!({"begin": txn, "end": txn + 1}))]),
        driver_checkpoints: BTreeMap::from([("db".to_string(), json!({"txn": txn}))]),
        max_keys: BTreeMap::from([("pageviews".to_string(), format!("{txn:02x}"))]),
    }
}

fn intent(txn: u64) -> Intent {
    Intent {
        txn,
        steps: BTreeMap::from([(
            "views".to_string(),
            vec![Resume::Replay {
                position: json!({"begin": txn, "end": txn + 1}),
                data: None,
                hash: 0xfeed + txn,
            }],
        )]),
    }
}

fn log_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("log")
}

#[test]
fn commits_and_intents_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        assert_eq!(log.last_commit(), None);
        log.write_intent(&intent(1)).unwrap();
        log.commit(&checkpoint(1)).unwrap();
        log.write_intent(&intent(2)).unwrap();
    }
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(1)));
    assert_eq!(log.pending_intent(), Some(&intent(2)));
    log.commit(&checkpoint(2)).unwrap();
    assert_eq!(log.pending_intent(), None, "a commit settles its intent");
    drop(log);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(2)));
    assert_eq!(log.pending_intent(), None);
}

#[test]
fn torn_tail_is_truncated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        log.commit(&checkpoint(1)).unwrap();
    }
    let good_len = std::fs::metadata(log_file(dir.path())).unwrap().len();
    // A crash mid-append: a header promising 100 bytes and only some of them.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(log_file(dir.path()))
        .unwrap();
    f.write_all(&100u32.to_le_bytes()).unwrap();
    f.write_all(&[1, 2, 3, 4, b'{', b'"']).unwrap();
    drop(f);

    let mut log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(1)));
    assert_eq!(
        std::fs::metadata(log_file(dir.path())).unwrap().len(),
        good_len
    );
    log.commit(&checkpoint(2)).unwrap();
    drop(log);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(
        log.last_commit(),
        Some(&checkpoint(2)),
        "appends go on after the cut"
    );
}

#[test]
fn zero_filled_tail_is_truncated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        log.commit(&checkpoint(1)).unwrap();
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(log_file(dir.path()))
        .unwrap();
    f.write_all(&[0; 64]).unwrap();
    drop(f);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(1)));
}

#[test]
fn corruption_before_the_last_record_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        log.commit(&checkpoint(1)).unwrap();
        log.commit(&checkpoint(2)).unwrap();
    }
    let mut bytes = std::fs::read(log_file(dir.path())).unwrap();
    bytes[12] ^= 0xff; // inside the first record's payload
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    match RecoveryLog::open(dir.path()) {
        Err(e @ RecoveryError::Corrupt { offset: 0, .. }) => {
            assert!(e.to_string().contains("checksum mismatch"), "{e}")
        }
        Err(e) => panic!("expected corruption at byte 0, got {e}"),
        Ok(_) => panic!("expected corruption at byte 0, the log opened"),
    }
}

#[test]
fn a_damaged_length_before_the_last_record_is_corruption_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        log.commit(&checkpoint(1)).unwrap();
        log.commit(&checkpoint(2)).unwrap();
    }
    let mut bytes = std::fs::read(log_file(dir.path())).unwrap();
    bytes[..4].copy_from_slice(&1_000_000u32.to_le_bytes()); // claims to run past the end
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    assert!(matches!(
        RecoveryLog::open(dir.path()),
        Err(RecoveryError::Corrupt { offset: 0, .. })
    ));
    assert_eq!(
        std::fs::read(log_file(dir.path())).unwrap(),
        bytes,
        "nothing is truncated"
    );
}

#[test]
fn second_open_fails_fast_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RecoveryLog::open(dir.path()).unwrap();
    let Err(err) = RecoveryLog::open(dir.path()) else {
        panic!("a second writer must be refused")
    };
    assert_eq!(
        err.to_string(),
        format!(
            "recovery log {} is in use by another sluice process (pid {})",
            dir.path().display(),
            std::process::id()
        )
    );
}

#[test]
fn the_lock_is_released_when_the_log_drops() {
    let dir = tempfile::tempdir().unwrap();
    drop(RecoveryLog::open(dir.path()).unwrap());
    RecoveryLog::open(dir.path()).expect("the lock was released");
}

#[test]
fn out_of_order_commit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    log.commit(&checkpoint(3)).unwrap();
    assert!(matches!(
        log.commit(&checkpoint(3)),
        Err(RecoveryError::OutOfOrder { .. })
    ));
    assert!(matches!(
        log.write_intent(&intent(2)),
        Err(RecoveryError::OutOfOrder { .. })
    ));
}

#[test]
fn compaction_keeps_the_latest_state_and_bounds_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(200 << 10);
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        for txn in 1..=40 {
            log.write_intent(&intent(txn)).unwrap();
            let mut c = checkpoint(txn);
            c.driver_checkpoints.insert("big".to_string(), json!(big));
            log.commit(&c).unwrap();
        }
        log.write_intent(&intent(41)).unwrap();
    }
    let len = std::fs::metadata(log_file(dir.path())).unwrap().len();
    assert!(len < 5 << 20, "the log was compacted ({len} bytes)");
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit().unwrap().txn, 40);
    assert_eq!(
        log.last_commit().unwrap().driver_checkpoints["big"],
        json!(big)
    );
    assert_eq!(log.pending_intent(), Some(&intent(41)));
}

#[test]
fn checkpoint_bytes_round_trip_and_empty_bytes_are_none() {
    let c = checkpoint(9);
    assert_eq!(Checkpoint::from_bytes(&c.to_bytes()).unwrap(), Some(c));
    assert_eq!(Checkpoint::from_bytes(b"").unwrap(), None);
    assert!(matches!(
        Checkpoint::from_bytes(b"{not json"),
        Err(RecoveryError::BadCheckpoint(_))
    ));
}

#[test]
fn inspect_renders_the_commit_and_pending_intent() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    log.commit(&checkpoint(4)).unwrap();
    log.write_intent(&intent(5)).unwrap();
    let text = inspect(dir.path()).expect("inspect works while the log is held");
    assert!(text.contains("last commit: transaction 4"), "{text}");
    assert!(
        text.contains(r#"source views: {"begin":4,"end":5}"#),
        "{text}"
    );
    assert!(text.contains(r#"materialization db: {"txn":4}"#), "{text}");
    assert!(text.contains("pending intent: transaction 5"), "{text}");
}

/// A plan as (resume-from txn or None for Fresh, replayed intent txn).
type Summary = (Option<u64>, Option<u64>);
/// (log commit txn, store checkpoint txn, pending intent txn) → expected plan.
type Row = (Option<u64>, Option<u64>, Option<u64>, Summary);

fn summary(plan: &RecoveryPlan) -> Summary {
    match plan {
        RecoveryPlan::Fresh => (None, None),
        RecoveryPlan::ResumeFrom(c) => (Some(c.txn), None),
        RecoveryPlan::ReplayThenResume { from, replay } => (Some(from.txn), Some(replay.txn)),
    }
}

#[test]
fn plan_recovery_decision_table() {
    // (log commit, store checkpoint, intent) → (resume from, replay)
    #[rustfmt::skip]
    let table: &[Row] = &[
        // Nothing committed anywhere.
        (None,    None,    None,    (None,    None)),
        (None,    None,    Some(1), (Some(0), Some(1))), // crashed during the first txn
        (None,    None,    Some(2), (None,    None)),    // cannot follow nothing: ignored
        // Only the log (non-authoritative store, or no checkpoint in it).
        (Some(5), None,    None,    (Some(5), None)),
        (Some(5), None,    Some(5), (Some(5), None)),    // already committed
        (Some(5), None,    Some(6), (Some(5), Some(6))), // crashed during txn 6
        (Some(5), None,    Some(7), (Some(5), None)),
        // Store and log agree.
        (Some(5), Some(5), None,    (Some(5), None)),
        (Some(5), Some(5), Some(6), (Some(5), Some(6))),
        // Store committed txn 6, the log's commit of it was lost.
        (Some(5), Some(6), None,    (Some(6), None)),
        (Some(5), Some(6), Some(6), (Some(6), None)),    // the intent is the store's txn
        (Some(5), Some(6), Some(7), (Some(6), Some(7))),
        // Store behind the log: the log's checkpoint is newer and wins.
        (Some(5), Some(4), None,    (Some(5), None)),
        (Some(5), Some(4), Some(5), (Some(5), None)),
        (Some(5), Some(4), Some(6), (Some(5), Some(6))),
        // Only the store (a new log next to an existing store).
        (None,    Some(3), None,    (Some(3), None)),
        (None,    Some(3), Some(3), (Some(3), None)),
        (None,    Some(3), Some(4), (Some(3), Some(4))),
        (None,    Some(3), Some(1), (Some(3), None)),
    ];
    for &(log, store, pending, expected) in table {
        let (log_c, store_c, intent_i) = (
            log.map(checkpoint),
            store.map(checkpoint),
            pending.map(intent),
        );
        let plan = plan_recovery(log_c.as_ref(), store_c.as_ref(), intent_i.as_ref());
        assert_eq!(
            summary(&plan),
            expected,
            "log {log:?}, store {store:?}, intent {pending:?}: {plan:?}"
        );
        // The chosen checkpoint is the whole one that won, not a rebuilt one.
        match &plan {
            RecoveryPlan::ResumeFrom(c) | RecoveryPlan::ReplayThenResume { from: c, .. }
                if c.txn > 0 =>
            {
                assert_eq!(c, &checkpoint(c.txn))
            }
            _ => {}
        }
    }
}

#[test]
fn store_checkpoint_wins_over_an_older_log_commit() {
    let mut store = checkpoint(6);
    store
        .driver_checkpoints
        .insert("db".to_string(), json!("from the store"));
    let plan = plan_recovery(Some(&checkpoint(5)), Some(&store), None);
    assert_eq!(plan, RecoveryPlan::ResumeFrom(store));
}
