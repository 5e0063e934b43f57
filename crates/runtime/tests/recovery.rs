//! The recovery log: durability across reopen, its format (header, versions, the
//! previous release's headerless logs), torn tails against corruption, one writer,
//! compaction, and the recovery decision table.

use serde_json::json;
use sluice_runtime::recovery::{
    Checkpoint, FORMAT_VERSION, Intent, MAGIC, RecoveryError, RecoveryLog, RecoveryPlan,
    StoreCheckpoint, inspect, plan_recovery,
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
        backfills: BTreeMap::new(),
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
        artifacts: BTreeMap::new(),
    }
}

fn log_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("log")
}

/// The file header's length: the magic and the format version.
const HEADER: usize = MAGIC.len() + 4;

/// A record framed as the log frames it: length, CRC-32 of the payload, payload.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes().to_vec();
    out.extend(crc32fast::hash(payload).to_le_bytes());
    out.extend(payload);
    out
}

/// The byte offsets at which the log's records start.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = HEADER;
    while at < bytes.len() {
        offsets.push(at);
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    offsets
}

/// A log in a new directory holding the commits of transactions `1..=commits`.
fn log_with_commits(commits: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    for txn in 1..=commits {
        log.commit(&checkpoint(txn)).unwrap();
    }
    dir
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
    bytes[HEADER + 12] ^= 0xff; // inside the first record's payload
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    match RecoveryLog::open(dir.path()) {
        Err(e @ RecoveryError::Corrupt { offset, .. }) if offset == HEADER as u64 => {
            assert!(e.to_string().contains("checksum mismatch"), "{e}")
        }
        Err(e) => panic!("expected corruption at byte {HEADER}, got {e}"),
        Ok(_) => panic!("expected corruption at byte {HEADER}, the log opened"),
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
    // Claims to run past the end.
    bytes[HEADER..HEADER + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    assert!(matches!(
        RecoveryLog::open(dir.path()),
        Err(RecoveryError::Corrupt { offset, .. }) if offset == HEADER as u64
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

/// A plan as (resume-from txn, or None for Fresh and R for Rebuild; replayed intent txn).
type Summary = (Option<u64>, Option<u64>);
/// What the store reported in Opened.
#[derive(Debug, Clone, Copy)]
enum Store {
    /// Empty bytes: the runtime's own checkpoint.
    Own,
    /// Empty bytes from a store that keeps the checkpoint: it holds none.
    Absent,
    /// The rebuild sentinel.
    Rebuild,
    /// The store's copy of the log's checkpoint of this transaction: the same commit,
    /// with the driver checkpoint of the one before (sent at Prepare, before the driver
    /// returned this transaction's).
    At(u64),
    /// A checkpoint of this transaction from another history (a different position).
    Other(u64),
}
/// (log commit txn, store, pending intent txn) → expected plan.
type Row = (Option<u64>, Store, Option<u64>, Summary);
const R: Option<u64> = Some(u64::MAX);
/// The plan refuses: the store lost what the log committed.
const LOST: Option<u64> = Some(u64::MAX - 1);

fn store_checkpoint(store: Store) -> StoreCheckpoint {
    match store {
        Store::Own => StoreCheckpoint::RuntimeOwn,
        Store::Absent => StoreCheckpoint::Absent,
        Store::Rebuild => StoreCheckpoint::Rebuild,
        Store::At(txn) => {
            let mut copy = checkpoint(txn);
            copy.driver_checkpoints = checkpoint(txn.saturating_sub(1)).driver_checkpoints;
            StoreCheckpoint::At(copy)
        }
        Store::Other(txn) => {
            let mut other = checkpoint(txn);
            other
                .sources
                .insert("views".into(), json!({"begin": 0, "end": 99}));
            StoreCheckpoint::At(other)
        }
    }
}

fn summary(plan: &RecoveryPlan) -> Summary {
    match plan {
        RecoveryPlan::Fresh => (None, None),
        RecoveryPlan::Rebuild => (R, None),
        RecoveryPlan::ResumeFrom(c) => (Some(c.txn), None),
        RecoveryPlan::ReplayThenResume { from, replay } => (Some(from.txn), Some(replay.txn)),
        RecoveryPlan::StoreLost { log_txn } => (LOST, Some(*log_txn)),
    }
}

#[test]
fn plan_recovery_decision_table() {
    use Store::{Absent, At, Other, Own, Rebuild};
    // (log commit, store, intent) → (resume from, replay)
    #[rustfmt::skip]
    let table: &[Row] = &[
        // Nothing committed anywhere.
        (None,    Own,        None,    (None,    None)),
        (None,    Own,        Some(1), (Some(0), Some(1))), // crashed during the first txn
        (None,    Own,        Some(2), (None,    None)),    // cannot follow nothing: ignored
        (None,    Rebuild,    None,    (None,    None)),    // a never-committed store
        (None,    Rebuild,    Some(1), (Some(0), Some(1))),
        (None,    Rebuild,    Some(2), (None,    None)),
        // Only the log (non-authoritative store, or no checkpoint in it).
        (Some(5), Own,        None,    (Some(5), None)),
        (Some(5), Own,        Some(5), (Some(5), None)),    // already committed
        (Some(5), Own,        Some(6), (Some(5), Some(6))), // crashed during txn 6
        (Some(5), Own,        Some(7), (Some(5), None)),
        // Store and log agree.
        (Some(5), At(5),      None,    (Some(5), None)),
        (Some(5), At(5),      Some(6), (Some(5), Some(6))),
        (Some(5), At(5),      Some(7), (Some(5), None)),
        // Store committed txn 6, the log's commit of it was lost.
        (Some(5), At(6),      None,    (Some(6), None)),
        (Some(5), At(6),      Some(6), (Some(6), None)),    // the intent is the store's txn
        (Some(5), At(6),      Some(7), (Some(6), None)),    // follows no commit of the log
        // Store behind the log (restored from a backup): the store's checkpoint wins,
        // and no intent of the log's later history is replayed.
        (Some(5), At(4),      None,    (Some(4), None)),
        (Some(5), At(4),      Some(5), (Some(4), None)),
        (Some(5), At(4),      Some(6), (Some(4), None)),
        // Same number, another history: the store's, and the log's intent does not follow it.
        (Some(5), Other(5),   None,    (Some(5), None)),
        (Some(5), Other(5),   Some(6), (Some(5), None)),
        // The store asks to rebuild: from the empty checkpoint, no intent replayed.
        (Some(5), Rebuild,    None,    (R,       None)),
        (Some(5), Rebuild,    Some(6), (R,       None)),
        (Some(5), Rebuild,    Some(1), (R,       None)),
        // A store that keeps the checkpoint holds none: it never committed, or (while the
        // log has commits) it was recreated or emptied: refused, whatever the intent.
        (None,    Absent,     None,    (None,    None)),
        (None,    Absent,     Some(1), (Some(0), Some(1))), // crashed during the first txn
        (None,    Absent,     Some(2), (None,    None)),
        (Some(5), Absent,     None,    (LOST,    Some(5))),
        (Some(5), Absent,     Some(6), (LOST,    Some(5))),
        (Some(1), Absent,     Some(1), (LOST,    Some(1))),
        // Only the store (a new log next to an existing store).
        (None,    At(3),      None,    (Some(3), None)),
        (None,    At(3),      Some(3), (Some(3), None)),
        (None,    At(3),      Some(4), (Some(3), None)),
        (None,    At(3),      Some(1), (Some(3), None)),
    ];
    for &(log, store, pending, expected) in table {
        let (log_c, store_c, intent_i) = (
            log.map(checkpoint),
            store_checkpoint(store),
            pending.map(intent),
        );
        let plan = plan_recovery(log_c.as_ref(), &store_c, intent_i.as_ref());
        assert_eq!(
            summary(&plan),
            expected,
            "log {log:?}, store {store:?}, intent {pending:?}: {plan:?}"
        );
        // The chosen checkpoint is the whole one that won, not a rebuilt one: the log's
        // where the store holds a copy of that commit (its driver checkpoint is newer).
        if let (
            RecoveryPlan::ResumeFrom(c) | RecoveryPlan::ReplayThenResume { from: c, .. },
            StoreCheckpoint::At(store),
        ) = (&plan, &store_c)
        {
            let expected = match &log_c {
                Some(log_c) if log_c.same_commit(store) => log_c,
                _ => store,
            };
            assert_eq!(c, expected, "log {log:?}, store {store:?}");
        }
    }
}

#[test]
fn store_checkpoint_wins_over_a_newer_or_older_log_commit() {
    let mut store = checkpoint(6);
    store
        .driver_checkpoints
        .insert("db".to_string(), json!("from the store"));
    for log in [checkpoint(5), checkpoint(9)] {
        let plan = plan_recovery(Some(&log), &StoreCheckpoint::At(store.clone()), None);
        assert_eq!(plan, RecoveryPlan::ResumeFrom(store.clone()));
    }
}

#[test]
fn opened_bytes_are_the_runtimes_own_the_rebuild_sentinel_or_a_checkpoint() {
    assert_eq!(
        StoreCheckpoint::from_opened(b"", false).unwrap(),
        StoreCheckpoint::RuntimeOwn
    );
    assert_eq!(
        StoreCheckpoint::from_opened(b"", true).unwrap(),
        StoreCheckpoint::Absent
    );
    assert_eq!(
        StoreCheckpoint::from_opened(&[0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01], true).unwrap(),
        StoreCheckpoint::Rebuild
    );
    assert_eq!(
        StoreCheckpoint::from_opened(&checkpoint(3).to_bytes(), true).unwrap(),
        StoreCheckpoint::At(checkpoint(3))
    );
    assert!(StoreCheckpoint::from_opened(&[0xf8, 0xff], true).is_err());
}

#[test]
fn an_adopted_older_checkpoint_becomes_the_last_commit_and_numbers_go_on_from_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RecoveryLog::open(dir.path()).unwrap();
        for txn in 1..=9 {
            log.write_intent(&intent(txn)).unwrap();
            log.commit(&checkpoint(txn)).unwrap();
        }
        log.write_intent(&intent(10)).unwrap();
        assert!(
            log.write_intent(&intent(5)).is_err(),
            "without adopt, going back is out of order"
        );
        log.adopt(&checkpoint(4)).unwrap();
        assert_eq!(log.last_commit(), Some(&checkpoint(4)));
        assert_eq!(log.pending_intent(), None, "the later intent is dropped");
        log.write_intent(&intent(5)).unwrap();
    }
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(
        log.last_commit(),
        Some(&checkpoint(4)),
        "durable across reopen"
    );
    assert_eq!(log.pending_intent(), Some(&intent(5)));
    log.commit(&checkpoint(5)).unwrap();
    drop(log);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(5)));
    assert_eq!(log.pending_intent(), None);
}

#[test]
fn adopting_the_last_commit_or_nothing_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    log.adopt(&Checkpoint::default()).unwrap();
    assert_eq!(
        std::fs::metadata(log_file(dir.path())).unwrap().len(),
        HEADER as u64,
        "the file header only"
    );
    log.commit(&checkpoint(2)).unwrap();
    log.write_intent(&intent(3)).unwrap();
    let len = std::fs::metadata(log_file(dir.path())).unwrap().len();
    log.adopt(&checkpoint(2)).unwrap();
    assert_eq!(std::fs::metadata(log_file(dir.path())).unwrap().len(), len);
    // A store's copy of that commit predates its driver checkpoint: the same commit.
    let mut copy = checkpoint(2);
    copy.driver_checkpoints.clear();
    log.adopt(&copy).unwrap();
    assert_eq!(std::fs::metadata(log_file(dir.path())).unwrap().len(), len);
    assert_eq!(
        log.pending_intent(),
        Some(&intent(3)),
        "kept for its replay"
    );
}

#[test]
fn a_new_log_starts_with_the_magic_and_this_format_version() {
    let dir = log_with_commits(1);
    let bytes = std::fs::read(log_file(dir.path())).unwrap();
    assert_eq!(bytes[..MAGIC.len()], MAGIC);
    assert_eq!(bytes[MAGIC.len()..HEADER], FORMAT_VERSION.to_le_bytes());
    assert_eq!(record_offsets(&bytes), [HEADER]);
}

#[test]
fn a_log_of_a_newer_format_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = MAGIC.to_vec();
    bytes.extend((FORMAT_VERSION + 1).to_le_bytes());
    bytes.extend(frame(br#"{"commit_v3":{"txn":1}}"#));
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    let err = RecoveryLog::open(dir.path())
        .err()
        .expect("a newer log is refused");
    let text = err.to_string();
    assert!(
        matches!(err, RecoveryError::NewerFormat { found, supported, .. }
            if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
        "{text}"
    );
    assert!(
        text.contains(&log_file(dir.path()).display().to_string())
            && text.contains(&format!("format version {}", FORMAT_VERSION + 1))
            && text.contains(&format!("version {FORMAT_VERSION} this sluice reads")),
        "{text}"
    );
    assert_eq!(
        std::fs::read(log_file(dir.path())).unwrap(),
        bytes,
        "left as it is"
    );
    assert!(inspect(dir.path()).is_err(), "inspect refuses it too");
}

#[test]
fn a_flipped_byte_in_the_middle_is_corruption_naming_the_file_offset_and_version() {
    let dir = log_with_commits(3);
    let mut bytes = std::fs::read(log_file(dir.path())).unwrap();
    let second = record_offsets(&bytes)[1];
    bytes[second + 20] ^= 0x01;
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    let err = RecoveryLog::open(dir.path())
        .err()
        .expect("corruption is refused");
    assert!(
        matches!(err, RecoveryError::Corrupt { offset, version, .. }
            if offset == second as u64 && version == FORMAT_VERSION),
        "{err}"
    );
    let text = err.to_string();
    let named = format!(
        "recovery log {} (format {FORMAT_VERSION}) is corrupt at byte {second}: checksum mismatch",
        log_file(dir.path()).display()
    );
    assert!(text.starts_with(&named), "{text}");
    assert_eq!(
        std::fs::read(log_file(dir.path())).unwrap(),
        bytes,
        "nothing is cut"
    );
}

#[test]
fn a_checksum_failure_in_the_last_record_is_a_torn_write_and_is_cut() {
    let dir = log_with_commits(3);
    let mut bytes = std::fs::read(log_file(dir.path())).unwrap();
    let last = *record_offsets(&bytes).last().unwrap();
    bytes[last + 20] ^= 0x01;
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(2)));
    assert_eq!(
        std::fs::metadata(log_file(dir.path())).unwrap().len(),
        last as u64
    );
}

#[test]
fn a_checksum_valid_record_that_does_not_deserialize_is_corruption_even_last() {
    let dir = log_with_commits(2);
    let mut bytes = std::fs::read(log_file(dir.path())).unwrap();
    let at = bytes.len();
    // A commit as a newer release might write it: a field this one does not know.
    let mut future = serde_json::to_value(checkpoint(3)).unwrap();
    future["watermark"] = json!(17);
    let payload = serde_json::to_vec(&json!({ "commit": future })).unwrap();
    bytes.extend(frame(&payload));
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    let err = RecoveryLog::open(dir.path())
        .err()
        .expect("an unreadable commit is refused");
    assert!(
        matches!(err, RecoveryError::Corrupt { offset, version, .. }
            if offset == at as u64 && version == FORMAT_VERSION),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&log_file(dir.path()).display().to_string())
            && text.contains(&format!(
                "(format {FORMAT_VERSION}) is corrupt at byte {at}"
            ))
            && text.contains("does not deserialize")
            && text.contains("watermark"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(log_file(dir.path())).unwrap(),
        bytes,
        "a record that may be a commit is never cut"
    );
}

/// Records exactly as the previous release (format 1, no file header) wrote them.
const HEADERLESS_RECORDS: [&str; 3] = [
    r#"{"intent":{"txn":1,"steps":{"views":[{"kind":"replay","position":{"begin":1,"end":2},"hash":65262}]}}}"#,
    r#"{"commit":{"txn":1,"sources":{"views":{"begin":1,"end":2}},"driver_checkpoints":{"db":{"txn":1}},"max_keys":{"pageviews":"01"}}}"#,
    r#"{"intent":{"txn":2,"steps":{"views":[{"kind":"replay","position":{"begin":2,"end":3},"hash":65263}]}}}"#,
];

#[test]
fn a_headerless_log_of_the_previous_release_is_read_and_rewritten_with_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = HEADERLESS_RECORDS
        .iter()
        .flat_map(|r| frame(r.as_bytes()))
        .collect();
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    let text = inspect(dir.path()).unwrap();
    assert!(text.contains("(format 1, "), "{text}");
    assert!(text.contains("last commit: transaction 1"), "{text}");

    let mut log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(1)));
    assert_eq!(log.pending_intent(), Some(&intent(2)));
    let rewritten = std::fs::read(log_file(dir.path())).unwrap();
    assert_eq!(rewritten[..MAGIC.len()], MAGIC, "rewritten with a header");
    assert_eq!(rewritten[MAGIC.len()..HEADER], FORMAT_VERSION.to_le_bytes());
    log.commit(&checkpoint(2)).unwrap();
    drop(log);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(2)));
    let text = inspect(dir.path()).unwrap();
    assert!(
        text.contains(&format!("(format {FORMAT_VERSION}, ")),
        "{text}"
    );
}

#[test]
fn a_log_torn_while_its_header_was_written_starts_again_empty() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(log_file(dir.path()), &MAGIC[..5]).unwrap();
    let mut log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), None);
    log.commit(&checkpoint(1)).unwrap();
    drop(log);
    let log = RecoveryLog::open(dir.path()).unwrap();
    assert_eq!(log.last_commit(), Some(&checkpoint(1)));
}
