//! The tests of the CDC steps (`cdc.rs`): steps of streamed transactions and of
//! backfill chunks, made from scripted rows and transactions.

use super::*;

/// A transaction of one-byte documents, or a part of one.
struct Txn {
    text: Vec<u8>,
    first: u64,
    whole: bool,
}

impl Transaction for Txn {
    fn docs(&self) -> impl Iterator<Item = &[u8]> {
        self.text.chunks(1)
    }

    fn meta(&self) -> TxnMeta {
        TxnMeta {
            docs: self.text.len(),
            bytes: self.text.len() as u64,
            first: self.first,
            whole: self.whole,
            log_offset: 7,
        }
    }
}

/// A whole transaction of the documents `docs`.
fn txn(docs: &str) -> Txn {
    Txn {
        text: docs.as_bytes().to_vec(),
        first: 0,
        whole: true,
    }
}

/// A part of a large transaction, not its last: its documents from `first` on.
fn part(first: u64, docs: &str) -> Txn {
    Txn {
        first,
        whole: false,
        ..txn(docs)
    }
}

fn limits(max_records: usize, max_bytes: u64) -> QueueLimits {
    QueueLimits {
        max_records,
        max_bytes,
        max_journaled: u64::MAX,
    }
}

/// Where each of `txns` goes, offered in turn to one step under `limits`.
fn placed(txns: Vec<Txn>, limits: QueueLimits) -> Vec<&'static str> {
    let mut batch = TxnBatch::default();
    (txns.into_iter())
        .map(|txn| match batch.offer(txn, limits) {
            Offer::Taken => "taken",
            Offer::Part(_) => "part",
            Offer::Full(_) => "full",
        })
        .collect()
}

/// Whole transactions fill a step to its limits (the first however large), and a
/// part of a large one is a step of its own.
#[test]
fn a_step_takes_whole_transactions_to_its_limits_and_a_part_alone() {
    let (two, two_bytes) = (limits(2, 100), limits(10, 2));
    assert_eq!(placed(vec![txn("abc"), txn("d")], two), ["taken", "full"]);
    let three = vec![txn("a"), txn("b"), txn("c")];
    assert_eq!(placed(three, two), ["taken", "taken", "full"]);
    assert_eq!(
        placed(vec![txn("ab"), txn("c")], two_bytes),
        ["taken", "full"]
    );
    assert_eq!(placed(vec![part(4, "xy")], limits(1, 1)), ["part"]);
    let after_one = vec![txn(""), part(0, "xy")];
    assert_eq!(placed(after_one, limits(10, 10)), ["taken", "full"]);
}

/// A part's documents name their index in the transaction; only a unit's last step
/// may end the input, and only an empty last part or a quiet step advances.
#[test]
fn streamed_steps_hash_every_document_and_mark_their_unit() {
    let origin: Arc<str> = "log".into();
    let mut out = Records::default();
    let mut step =
        |txns: &[Txn], streamed| stream_step(&origin, txns, &mut out, Value::Null, true, streamed);
    let first = step(&[part(4, "xy")], Streamed::Part { last: false });
    assert_eq!((first.records, first.bytes), (2, 2));
    assert!(first.unit_continues && !first.end_of_input && !first.advances);
    let mut hasher = StepHasher::new();
    hasher.append(b"x\ny\n");
    assert_eq!(first.resume.hash(), hasher.finish());
    let last = step(&[], Streamed::Part { last: true });
    assert!(last.advances && last.end_of_input && !last.unit_continues);
    let quiet = step(&[], Streamed::Quiet);
    assert!(quiet.advances && quiet.records == 0);
    assert!(!step(&[], Streamed::Txns).advances);
    let second = out.get(1).expect("two records").position;
    assert_eq!((second.line, second.byte_offset), (7, 5));
}

/// A replayed backfill step hands the same documents at the same positions and
/// hashes as the step first read.
#[test]
fn a_journaled_step_replays_as_it_was_read() {
    let origin: Arc<str> = "slot s".into();
    let (mut first, mut again) = (Records::default(), Records::default());
    let mut journal = Journal::new(&mut first, &origin, 42);
    journal.push(br#"{"a":1}"#);
    journal.push(br#"{"a":2}"#);
    let step = journal.into_step(Value::from("p"));
    let Resume::Replay {
        data: Some(data), ..
    } = &step.resume
    else {
        panic!("a journaled step: {step:?}")
    };
    let replayed = replay_journal(&origin, 42, data, &Value::from("p"), &mut again);
    assert_eq!(replayed, step);
    let positions = |r: &Records| {
        (0..r.len())
            .map(|i| r.get(i).expect("a record").position.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(positions(&again), positions(&first));
}

/// Rows come a chunk at a time; the step ends at its limits and resumes with the row
/// it had no room for; a table read to its end is said before the next one starts.
#[test]
fn a_backfill_reads_chunks_within_its_step_limits() {
    let origin: Arc<str> = "s".into();
    let (mut out, mut next) = (Records::default(), Records::default());
    let mut chunks = Chunks::<u32>::new(0, None, 2);
    let mut journal = Journal::new(&mut out, &origin, 1);
    let fill = |chunks: &mut Chunks<u32>, journal: &mut Journal<'_>| {
        chunks.fill(
            journal,
            limits(3, 1000),
            2,
            |table| table == 1,
            |_, row, doc| doc.extend_from_slice(row.to_string().as_bytes()),
            |_, row| vec![row.to_string()],
        )
    };
    let mut asked = Vec::new();
    loop {
        match fill(&mut chunks, &mut journal) {
            Fill::StepEnds => break,
            Fill::TableRead { table } => asked.push(format!("read {table}")),
            Fill::Chunk { limit, whole } => {
                asked.push(format!("chunk {} after {:?}", chunks.table, chunks.after));
                let rows = match chunks.after.as_deref() {
                    None => vec![1, 2],
                    Some(_) => vec![3],
                };
                chunks.add(rows, limit, whole);
            }
        }
    }
    assert_eq!(journal.records(), 3);
    assert_eq!(
        asked,
        [
            "chunk 0 after None",
            r#"chunk 0 after Some(["2"])"#,
            "read 0",
        ]
    );
    assert_eq!(chunks.table, 1);
    // Table 1 is read whole: a step of its own.
    assert_eq!(fill(&mut chunks, &mut journal), Fill::StepEnds);
    let mut journal = Journal::new(&mut next, &origin, 1);
    assert_eq!(
        fill(&mut chunks, &mut journal),
        Fill::Chunk {
            limit: usize::MAX,
            whole: true
        }
    );
    chunks.add(vec![7, 8, 9, 10], usize::MAX, true);
    assert_eq!(
        fill(&mut chunks, &mut journal),
        Fill::TableRead { table: 1 }
    );
    assert_eq!(journal.records(), 4, "past the step's limits: whole");
    assert_eq!(chunks.after, None);
    assert_eq!(fill(&mut chunks, &mut journal), Fill::StepEnds);
}

/// One backfill step of a table of rows 1 to 5 (each journaled as `000N` and a
/// newline: 5 bytes), read in chunks of up to 10 rows after the last key, with
/// `room` left to journal: how many rows it took, and the key it resumes after
/// (empty: none, at a table's start).
fn step_with_room(chunks: &mut Chunks<u32>, room: u64, queries: &mut u32) -> (usize, String) {
    let origin: Arc<str> = "s".into();
    let mut out = Records::default();
    let mut journal = Journal::new(&mut out, &origin, 1);
    let limits = QueueLimits {
        max_records: 100,
        max_bytes: u64::MAX,
        max_journaled: room,
    };
    loop {
        let fill = chunks.fill(
            &mut journal,
            limits,
            1,
            |_| false,
            |_, row, doc| doc.extend_from_slice(format!("{row:04}").as_bytes()),
            |_, row| vec![row.to_string()],
        );
        match fill {
            Fill::StepEnds => break,
            Fill::TableRead { .. } => {}
            Fill::Chunk { limit, whole } => {
                *queries += 1;
                let after = (chunks.after.as_ref()).map_or(0, |key| key[0].parse().unwrap());
                let rows = (after + 1..=5).take(limit).collect();
                chunks.add(rows, limit, whole);
            }
        }
    }
    let after = chunks.after.as_ref().map(|key| key.join(","));
    (journal.records(), after.unwrap_or_default())
}

/// A step ends before the row that would take its journal past the room its
/// transaction's intent has left, within a chunk, and resumes after its last row; a
/// row larger than the room goes alone.
#[test]
fn a_backfill_step_ends_before_its_journal_passes_the_room_left() {
    let (mut chunks, mut queries) = (Chunks::<u32>::new(0, None, 10), 0);
    assert_eq!(
        step_with_room(&mut chunks, 12, &mut queries),
        (2, "2".into())
    );
    assert_eq!(
        step_with_room(&mut chunks, 10, &mut queries),
        (2, "4".into())
    );
    assert_eq!(queries, 1, "the chunk's other rows start the next steps");
    // Row 5 alone, then the table's end: the next table, from its start.
    assert_eq!(
        step_with_room(&mut chunks, 3, &mut queries),
        (1, String::new())
    );
    assert_eq!(chunks.table, 1, "the table was read to its end");
}

#[test]
fn quiet_steps_come_sooner_the_further_past_the_checkpoint() {
    assert_eq!(quiet_step_wait(0), QUIET_IDLE);
    assert_eq!(quiet_step_wait(QUIET_BYTES - 1), QUIET_IDLE);
    assert_eq!(quiet_step_wait(QUIET_BYTES), QUIET_EVERY);
    assert_eq!(quiet_step_wait(u64::MAX), QUIET_EVERY);
}
