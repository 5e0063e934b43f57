//! The source against a real PostgreSQL with `wal_level=logical` (a private cluster per
//! test, [`LogicalPostgres`]): every type's JSON from the snapshot and from the stream,
//! a backfill plus streamed inserts, updates and deletes folded by key equal to the
//! table, restarts mid-backfill and mid-stream that neither lose nor repeat a change,
//! the replay hash check, and each named error.

use serde_json::{Value, json};
use sluice_postgres_cdc::{PostgresCdcConfig, PostgresCdcSource};
use sluice_source_sdk::testing::{parsed_docs, records};
use sluice_source_sdk::{Lag, Records, Resume, Source, SourceError, Step};
use sluice_testkit::postgres::LogicalPostgres;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

async fn sql(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

fn config(url: &str, extra: Value) -> PostgresCdcConfig {
    let mut value = json!({"url": url, "tables": ["public.items"], "chunk_rows": 3});
    value
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let config: PostgresCdcConfig = sluice_source_sdk::config::parse(value).unwrap();
    config.check().unwrap();
    config
}

fn source(config: &PostgresCdcConfig) -> PostgresCdcSource {
    PostgresCdcSource::new("cdc", "test", config).unwrap()
}

/// One step and its documents.
async fn step(source: &mut PostgresCdcSource, max: usize) -> (Vec<Value>, Step) {
    let mut out = Records::default();
    let step = source.queue(records(max), &mut out).await.unwrap();
    assert_eq!(step.records, out.len());
    (parsed_docs(&mut out), step)
}

/// Steps until `done` holds of what was read, or the clock runs out.
async fn until(
    source: &mut PostgresCdcSource,
    max: usize,
    docs: &mut Vec<Value>,
    steps: &mut Vec<Step>,
    done: impl Fn(&[Value], &Step) -> bool,
) {
    let started = Instant::now();
    loop {
        let (got, s) = step(source, max).await;
        docs.extend(got);
        let finished = done(docs, &s);
        steps.push(s);
        if finished {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no end after {} docs: {docs:?}",
            docs.len()
        );
        if steps.last().unwrap().records == 0 {
            tokio::time::timeout(Duration::from_millis(200), source.ready())
                .await
                .ok();
        }
    }
}

/// Folds change documents by `id`: a delete forgets the key.
fn fold(docs: &[Value]) -> BTreeMap<i64, Value> {
    let mut table = BTreeMap::new();
    for doc in docs {
        let id = doc["id"].as_i64().unwrap();
        if doc["_meta"]["op"] == "d" {
            table.remove(&id);
        } else {
            let mut row = doc.clone();
            row.as_object_mut().unwrap().remove("_meta");
            table.insert(id, row);
        }
    }
    table
}

async fn table_rows(client: &Client) -> BTreeMap<i64, Value> {
    let rows = client
        .query("SELECT id, name, qty FROM items ORDER BY id", &[])
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let id: i64 = r.get(0);
            let name: Option<String> = r.get(1);
            let qty: Option<i32> = r.get(2);
            (id, json!({"id": id, "name": name, "qty": qty}))
        })
        .collect()
}

async fn items(client: &Client, n: i64) {
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int);
             INSERT INTO items SELECT g, 'item ' || g, g * 10 FROM generate_series(1, {n}) g;"
        ))
        .await
        .unwrap();
}

fn caught_up(_: &[Value], s: &Step) -> bool {
    s.end_of_input
}

#[tokio::test]
async fn snapshot_then_streamed_changes_fold_to_the_table() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 10).await;
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    // The backfill: chunks of 3 rows (chunk_rows), steps of at most 4 documents.
    until(&mut cdc, 4, &mut docs, &mut steps, |d, _| d.len() >= 10).await;
    assert_eq!(cdc.lag(), None, "no WAL position is behind a backfill");
    assert!(docs.iter().all(|d| d["_meta"]["op"] == "r"), "{docs:?}");
    assert_eq!(
        docs[0]["_meta"]["source"],
        json!({"schema": "public", "table": "items"})
    );
    assert!(steps.iter().all(|s| s.records <= 4));
    client
        .batch_execute(
            "INSERT INTO items VALUES (11, 'new', 1), (12, 'newer', 2);
             UPDATE items SET qty = qty + 1 WHERE id IN (2, 11);
             DELETE FROM items WHERE id IN (3, 12);
             BEGIN; UPDATE items SET id = 100 WHERE id = 4; INSERT INTO items VALUES (13, NULL, NULL); COMMIT;",
        )
        .await
        .unwrap();
    until(&mut cdc, 1000, &mut docs, &mut steps, caught_up).await;
    // Caught up: what the server reported beyond the last commit handed over is at
    // most the WAL of records that are no change (checkpoints, other tables).
    assert!(
        matches!(cdc.lag(), Some(Lag::Bytes(behind)) if behind < 1 << 20),
        "{:?}",
        cdc.lag()
    );
    let ops: Vec<&str> = docs[10..]
        .iter()
        .map(|d| d["_meta"]["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        ["c", "c", "u", "u", "d", "d", "d", "u", "c"],
        "{docs:?}"
    );
    assert_eq!(
        docs[10 + 4],
        json!({"_meta": docs[10 + 4]["_meta"], "id": 3}),
        "a delete carries the key"
    );
    assert_eq!(fold(&docs), table_rows(&client).await);
    // Each streamed step is whole transactions: the last one both of its changes.
    let last = steps.iter().rev().find(|s| s.records > 0).unwrap();
    assert!(last.records >= 2, "{last:?}");
}

#[tokio::test]
async fn every_type_reads_the_same_from_the_snapshot_and_the_stream() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    client
        .batch_execute(
            "CREATE TYPE mood AS ENUM ('sad', 'happy');
             CREATE TABLE items (id int PRIMARY KEY, i2 smallint, i8 bigint, num numeric,
               big numeric, f4 real, f8 double precision, nan float8, b boolean, t text,
               vc varchar(10), u uuid, d date, tm time, ts timestamp, tstz timestamptz,
               j json, jb jsonb, by bytea, arr int[], tarr text[], m mood, n text);",
        )
        .await
        .unwrap();
    let row = |id: i32| {
        format!(
            "INSERT INTO items VALUES ({id}, -32768, 9007199254740993, 123.4500,
               12345678901234567890.5, 1.5, 0.1, 'NaN', true, 'tab\t\"quote\"', 'var',
               'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '13:14:15.5',
               '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02', '{{\"a\": [1, 2]}}',
               '{{\"b\": null}}', '\\x00ff10', '{{{{1,2}},{{3,NULL}}}}', '{{\"a b\",c}}', 'happy', NULL)"
        )
    };
    client.batch_execute(&row(1)).await.unwrap();
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, |d, _| !d.is_empty()).await;
    client.batch_execute(&row(2)).await.unwrap();
    until(&mut cdc, 100, &mut docs, &mut steps, |d, _| d.len() >= 2).await;
    let expected = json!({
        "i2": -32768, "i8": 9007199254740993_i64, "num": 123.45,
        "big": "12345678901234567890.5", "f4": 1.5, "f8": 0.1, "nan": "NaN", "b": true,
        "t": "tab\t\"quote\"", "vc": "var", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "d": "2024-02-29", "tm": "13:14:15.5", "ts": "2024-01-02T03:04:05.123456",
        "tstz": "2024-01-02T01:04:05Z", "j": {"a": [1, 2]}, "jb": {"b": null},
        "by": "AP8Q", "arr": [[1, 2], [3, null]], "tarr": ["a b", "c"], "m": "happy",
        "n": null,
    });
    for (doc, id) in docs.iter().zip([1, 2]) {
        let mut doc = doc.clone();
        let doc = doc.as_object_mut().unwrap();
        doc.remove("_meta");
        assert_eq!(doc.remove("id"), Some(json!(id)));
        for (column, want) in expected.as_object().unwrap() {
            assert_eq!(doc.get(column), Some(want), "column {column} of row {id}");
        }
        assert_eq!(doc.len(), expected.as_object().unwrap().len());
    }
}

/// Commits `steps` as the runtime would: the position of the last, told to the source.
fn commit(source: &mut PostgresCdcSource, steps: &[Step]) -> Value {
    let position = steps.last().unwrap().resume.position().unwrap().clone();
    source.committed(1, &position);
    position
}

#[tokio::test]
async fn a_restart_mid_backfill_continues_under_a_new_snapshot_without_loss_or_repeat() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 12).await;
    let config = config(&pg.url(), json!({}));
    let mut first = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut first, 2, &mut docs, &mut steps, |d, _| d.len() >= 4).await;
    let committed = commit(&mut first, &steps);
    // Read on past the commit (lost in the crash), then crash.
    let (lost, _) = step(&mut first, 2).await;
    assert!(!lost.is_empty());
    drop(first);
    // Changes while down: below the committed key, above it, and new rows.
    client
        .batch_execute(
            "UPDATE items SET qty = -1 WHERE id IN (1, 9);
             DELETE FROM items WHERE id IN (2, 10);
             INSERT INTO items VALUES (50, 'late', 5);",
        )
        .await
        .unwrap();
    let mut second = source(&config);
    second.seek(&committed).await.unwrap();
    let mut after = Vec::new();
    until(&mut second, 100, &mut after, &mut Vec::new(), caught_up).await;
    docs.extend(after.iter().cloned());
    assert_eq!(fold(&docs), table_rows(&client).await);
    // Keys above the committed one were read under the new snapshot, which holds the
    // changes made while down: their streamed changes are skipped, not repeated.
    let streamed: Vec<i64> = after
        .iter()
        .filter(|d| d["_meta"]["op"] != "r")
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(streamed, [1, 2], "{after:?}");
}

#[tokio::test]
async fn a_restart_mid_stream_replays_the_step_by_its_lsn_range() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 2).await;
    let config = config(&pg.url(), json!({}));
    let mut first = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut first, 100, &mut docs, &mut steps, caught_up).await;
    for i in 0..5 {
        client
            .batch_execute(&format!("INSERT INTO items VALUES ({}, 'x', {i})", 10 + i))
            .await
            .unwrap();
    }
    until(&mut first, 2, &mut docs, &mut steps, |d, _| d.len() >= 5).await;
    let committed = commit(&mut first, &steps);
    // The step the crash interrupts: read and journaled, not committed.
    let (mut interrupted_docs, mut interrupted) = (Vec::new(), Vec::new());
    until(
        &mut first,
        2,
        &mut interrupted_docs,
        &mut interrupted,
        |d, _| !d.is_empty(),
    )
    .await;
    let journaled = interrupted.pop().unwrap().resume;
    assert!(interrupted.iter().all(|s| s.records == 0));
    assert!(
        matches!(&journaled, Resume::Replay { data: None, .. }),
        "{journaled:?}"
    );
    drop(first);
    let mut second = source(&config);
    second.seek(&committed).await.unwrap();
    // A replay with another hash is refused.
    if let Resume::Replay { position, hash, .. } = &journaled {
        let tampered = Resume::Replay {
            position: position.clone(),
            data: None,
            hash: hash ^ 1,
        };
        let err = second
            .replay(&tampered, &mut Records::default())
            .await
            .unwrap_err();
        assert!(matches!(err, SourceError::ReplayMismatch { .. }), "{err}");
    }
    second.seek(&committed).await.unwrap();
    let mut out = Records::default();
    let replayed = second.replay(&journaled, &mut out).await.unwrap();
    assert_eq!(replayed.resume, journaled);
    assert_eq!(parsed_docs(&mut out), interrupted_docs);
    docs.extend(interrupted_docs);
    until(&mut second, 100, &mut docs, &mut Vec::new(), caught_up).await;
    assert_eq!(fold(&docs), table_rows(&client).await);
    let ids: Vec<i64> = docs[2..]
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [10, 11, 12, 13, 14], "each change handed over once");
}

async fn error_of(source: &mut PostgresCdcSource) -> String {
    let mut out = Records::default();
    for _ in 0..100 {
        match source.queue(records(100), &mut out).await {
            Err(e) => return e.to_string(),
            Ok(s) if s.records == 0 => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(_) => {}
        }
    }
    panic!("no error");
}

#[tokio::test]
async fn bad_setups_get_errors_naming_what_to_change() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    client
        .batch_execute("CREATE TABLE nokey (a int); CREATE TABLE items (id bigint PRIMARY KEY);")
        .await
        .unwrap();
    let err = error_of(&mut source(&config(
        &pg.url(),
        json!({"tables": null, "publication": "nope"}),
    )))
    .await;
    assert!(
        err.contains("publication `nope` does not exist") && err.contains("tables:"),
        "{err}"
    );
    let err = error_of(&mut source(&config(
        &pg.url(),
        json!({"tables": ["nokey"], "slot": "nokey"}),
    )))
    .await;
    assert!(
        err.contains("table public.nokey has no primary key"),
        "{err}"
    );
    // The shared server runs wal_level=replica.
    let err = error_of(&mut source(&config(
        "postgres://postgres@127.0.0.1:5432/test",
        json!({}),
    )))
    .await;
    assert!(
        err.contains("wal_level = replica") && err.contains("logical"),
        "{err}"
    );
    // A slot dropped under a committed position.
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, caught_up).await;
    let committed = commit(&mut cdc, &steps);
    cdc.disconnect().await;
    drop(cdc);
    let slot = config.slot_name("test", "cdc");
    let started = Instant::now();
    while let Err(e) = client
        .batch_execute(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await
    {
        assert!(started.elapsed() < Duration::from_secs(30), "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut cdc = source(&config);
    cdc.seek(&committed).await.unwrap();
    let err = error_of(&mut cdc).await;
    assert!(
        err.contains(&format!("replication slot `{slot}` no longer exists")),
        "{err}"
    );
}

#[tokio::test]
async fn a_truncate_stops_the_source_naming_the_table() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 1).await;
    let mut cdc = source(&config(&pg.url(), json!({})));
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, caught_up).await;
    client.batch_execute("TRUNCATE items").await.unwrap();
    let err = error_of(&mut cdc).await;
    assert!(err.contains("table public.items was truncated"), "{err}");
}

/// The slot's `confirmed_flush_lsn`, as a byte position.
async fn confirmed_flush(client: &Client, slot: &str) -> u64 {
    let row = client
        .query_one(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::text FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// The slot never confirms what the recovery log does not hold: streamed steps read
/// (and status updates sent meanwhile) leave it where it was; once the source is told
/// their transaction is durable, it confirms exactly their end.
#[tokio::test]
async fn the_slot_confirms_a_step_only_once_told_it_is_committed() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 3).await;
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, |d, _| d.len() >= 3).await;
    client
        .batch_execute(
            "INSERT INTO items VALUES (4, 'a', 1); INSERT INTO items VALUES (5, 'b', 2);",
        )
        .await
        .unwrap();
    until(&mut cdc, 100, &mut docs, &mut steps, |d, _| d.len() >= 5).await;
    let position = steps.last().unwrap().resume.position().unwrap().clone();
    assert_eq!(position["phase"], "stream", "{position}");
    let end = position["end"].as_u64().unwrap();
    let slot = cdc.slot().to_string();
    // Several status updates go out meanwhile (every 200 ms while catching up).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = confirmed_flush(&client, &slot).await;
    assert!(
        before < end,
        "confirmed {before} before the commit of {end}"
    );
    cdc.committed(1, &position);
    let started = Instant::now();
    while confirmed_flush(&client, &slot).await != end {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "confirmed {} after the commit of {end}",
            confirmed_flush(&client, &slot).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's current WAL position, as a byte position.
async fn wal_lsn(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::text", &[])
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// WAL written to a table outside the publication reaches the source only as
/// keepalives: it makes a step without records that moves its position past that WAL
/// (`advances`), the slot confirms it only once told it is committed, and a restart
/// replays it as the same empty step and reads on exactly after it.
#[tokio::test]
async fn a_quiet_slot_moves_past_wal_written_outside_the_publication() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 2).await;
    client
        .batch_execute("CREATE TABLE noise (id bigint PRIMARY KEY, pad text)")
        .await
        .unwrap();
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let slot = cdc.slot().to_string();
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, caught_up).await;
    let committed = commit(&mut cdc, &steps);
    // About 8 MiB of WAL in four transactions, none of them captured.
    for i in 0..4 {
        client
            .batch_execute(&format!(
                "INSERT INTO noise SELECT g, repeat('x', 1000) FROM \
                 generate_series({}, {}) g",
                i * 2000 + 1,
                (i + 1) * 2000
            ))
            .await
            .unwrap();
    }
    let written = wal_lsn(&client).await;
    let started = Instant::now();
    let mut quiet = Vec::new();
    until(&mut cdc, 100, &mut docs, &mut quiet, |_, s| {
        s.advances && s.resume.position().unwrap()["end"].as_u64().unwrap() >= written
    })
    .await;
    let took = started.elapsed();
    let step = quiet.pop().unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the quiet step took {took:?}"
    );
    assert_eq!(step.records, 0);
    assert_eq!(docs.len(), 2, "nothing captured: {docs:?}");
    let position = step.resume.position().unwrap().clone();
    assert_eq!(position["quiet"], true, "{position}");
    let end = position["end"].as_u64().unwrap();
    // Not confirmed before it is committed ...
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(confirmed_flush(&client, &slot).await < written);
    // ... and exactly its end once it is.
    cdc.committed(2, &position);
    let started = Instant::now();
    while confirmed_flush(&client, &slot).await != end {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "confirmed {} after the commit of {end}",
            confirmed_flush(&client, &slot).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(cdc);
    // A restart at the quiet step's position reads on exactly after it.
    client
        .batch_execute("INSERT INTO items VALUES (3, 'after', 3)")
        .await
        .unwrap();
    let mut second = source(&config);
    second.seek(&position).await.unwrap();
    let mut after = Vec::new();
    until(&mut second, 100, &mut after, &mut Vec::new(), |d, _| {
        !d.is_empty()
    })
    .await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0]["id"], 3);
    // The position committed before the quiet step is now behind the slot.
    let mut third = source(&config);
    let err = third.seek(&committed).await.unwrap_err();
    assert!(matches!(err, SourceError::SeekBack { .. }), "{err}");
}

/// A quiet step that was journaled but not committed is replayed exactly: no record,
/// the same resume, and the stream continues after it.
#[tokio::test]
async fn an_interrupted_quiet_step_replays_as_the_same_empty_step() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 1).await;
    client
        .batch_execute("CREATE TABLE noise (id bigint PRIMARY KEY, pad text)")
        .await
        .unwrap();
    let config = config(&pg.url(), json!({}));
    let mut first = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut first, 100, &mut docs, &mut steps, caught_up).await;
    let committed = commit(&mut first, &steps);
    client
        .batch_execute(
            "INSERT INTO noise SELECT g, repeat('x', 1000) FROM generate_series(1, 3000) g",
        )
        .await
        .unwrap();
    let mut quiet = Vec::new();
    until(&mut first, 100, &mut docs, &mut quiet, |_, s| s.advances).await;
    let journaled = quiet.pop().unwrap().resume;
    drop(first);
    client
        .batch_execute("INSERT INTO items VALUES (2, 'next', 2)")
        .await
        .unwrap();
    let mut second = source(&config);
    second.seek(&committed).await.unwrap();
    let mut out = Records::default();
    let replayed = second.replay(&journaled, &mut out).await.unwrap();
    assert_eq!((replayed.records, replayed.advances), (0, true));
    assert_eq!(replayed.resume, journaled);
    let mut after = Vec::new();
    until(&mut second, 100, &mut after, &mut Vec::new(), |d, _| {
        !d.is_empty()
    })
    .await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0]["id"], 2);
}

/// `seek` refuses a position the slot has confirmed past (the server would silently
/// start later), naming both LSNs, the slot and what to do; a position at or after
/// the confirmed one is fine.
#[tokio::test]
async fn a_seek_behind_what_the_slot_confirmed_is_refused() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 2).await;
    let config = config(&pg.url(), json!({}));
    let mut cdc = source(&config);
    let slot = cdc.slot().to_string();
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, caught_up).await;
    let backfilled = steps.last().unwrap().resume.position().unwrap().clone();
    let mut stream_positions = Vec::new();
    for id in [3, 4] {
        client
            .batch_execute(&format!("INSERT INTO items VALUES ({id}, 'x', 1)"))
            .await
            .unwrap();
        let mut got = Vec::new();
        until(&mut cdc, 100, &mut got, &mut steps, |d, _| !d.is_empty()).await;
        stream_positions.push(steps.last().unwrap().resume.position().unwrap().clone());
    }
    let (first, second) = (&stream_positions[0], &stream_positions[1]);
    cdc.committed(1, first);
    let end = first["end"].as_u64().unwrap();
    let started = Instant::now();
    while confirmed_flush(&client, &slot).await != end {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(cdc);
    // At the confirmed position, and after it: fine.
    source(&config).seek(first).await.unwrap();
    source(&config).seek(second).await.unwrap();
    // Behind it: the backfill's end (its consistent point), and a stream position.
    let behind = json!({"phase": "stream", "begin": end - 2, "end": end - 1});
    for position in [&backfilled, &behind] {
        let err = source(&config).seek(position).await.unwrap_err();
        assert!(matches!(err, SourceError::SeekBack { .. }), "{err}");
        assert!(!err.is_retryable());
        let text = err.to_string();
        let confirmed = format!("has confirmed LSN {:X}/{:X}", end >> 32, end & 0xffff_ffff);
        assert!(text.contains(&confirmed), "{text}");
        assert!(
            text.contains(&format!("replication slot `{slot}`")),
            "{text}"
        );
        assert!(text.contains("sluice apply --delete"), "{text}");
    }
    let err = source(&config).seek(&behind).await.unwrap_err().to_string();
    let from = end - 1;
    assert!(
        err.contains(&format!(
            "cannot seek back to \"{:X}/{:X}\"",
            from >> 32,
            from & 0xffff_ffff
        )),
        "{err}"
    );
}

/// `heartbeat` writes its logical message into the WAL on schedule (seen here through a
/// `test_decoding` slot), pgoutput does not hand it over as a document, and the WAL
/// the slot holds back is read for `retained`.
#[tokio::test]
async fn the_heartbeat_writes_wal_and_the_retained_wal_is_known() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 1).await;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('peek', 'test_decoding')")
        .await
        .unwrap();
    let config = config(&pg.url(), json!({"heartbeat": "1s"}));
    let mut cdc = source(&config);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut cdc, 100, &mut docs, &mut steps, caught_up).await;
    let started = Instant::now();
    let mut after = Vec::new();
    while started.elapsed() < Duration::from_millis(3500) {
        until(&mut cdc, 100, &mut after, &mut Vec::new(), |_, _| true).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(after.is_empty(), "a heartbeat is no document: {after:?}");
    let beats = client
        .query(
            "SELECT data FROM pg_logical_slot_peek_changes('peek', NULL, NULL) \
             WHERE data LIKE '%sluice-heartbeat%'",
            &[],
        )
        .await
        .unwrap()
        .len();
    assert!((2..=4).contains(&beats), "{beats} heartbeats in 3.5 s");
    let started = Instant::now();
    while cdc.retained().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no retained WAL read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cdc.retained().unwrap() < 16 << 20, "{:?}", cdc.retained());
    client
        .batch_execute("SELECT pg_drop_replication_slot('peek')")
        .await
        .unwrap();
}

/// (table, id, op) of each document, for comparing change streams.
fn changes(docs: &[Value]) -> Vec<(String, i64, String)> {
    docs.iter()
        .map(|d| {
            let meta = &d["_meta"];
            (
                meta["source"]["table"].as_str().unwrap().to_string(),
                d["id"].as_i64().unwrap(),
                meta["op"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Reads steps until `n` documents were handed over, keeping only the steps with
/// documents (the runtime drops the others), each with its documents.
async fn steps_of(source: &mut PostgresCdcSource, n: usize) -> Vec<(Step, Vec<Value>)> {
    let started = Instant::now();
    let (mut read, mut got) = (0, Vec::new());
    while read < n {
        let (docs, s) = step(source, 100).await;
        if s.records == 0 {
            assert!(!s.unit_continues, "{s:?}");
            assert!(started.elapsed() < Duration::from_secs(60), "{got:?}");
            tokio::time::timeout(Duration::from_millis(200), source.ready())
                .await
                .ok();
            continue;
        }
        read += docs.len();
        got.push((s, docs));
    }
    got
}

/// One upstream transaction over two captured tables, larger than two parts, is handed
/// over as a unit: a step per part, `unit_continues` on all but the last, together the
/// transaction's changes in order. Each part replays alone on a fresh source to the same
/// documents and hash (whatever part size the replaying stream decodes), a position
/// inside the unit is refused by `seek`, the parts replay one after another as after a
/// crash, and a restart at the position before the transaction reads it again whole.
#[tokio::test]
async fn a_large_transaction_spanning_tables_is_handed_over_as_one_unit_of_parts() {
    let pg = LogicalPostgres::start();
    let client = sql(&pg.url()).await;
    items(&client, 1).await;
    client
        .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, item bigint)")
        .await
        .unwrap();
    let config = config(
        &pg.url(),
        json!({"tables": ["public.items", "public.orders"]}),
    );
    let mut first = source(&config);
    first.set_part_docs(4);
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(&mut first, 100, &mut docs, &mut steps, caught_up).await;
    let before = commit(&mut first, &steps);
    // 11 documents (parts of 4, 4 and 3) across both tables, then a small transaction.
    client
        .batch_execute(
            "BEGIN;
             INSERT INTO items SELECT g, 'bulk', g FROM generate_series(100, 104) g;
             INSERT INTO orders SELECT g, g + 100 FROM generate_series(1, 4) g;
             UPDATE items SET qty = 0 WHERE id = 1;
             DELETE FROM orders WHERE id = 2;
             COMMIT;
             INSERT INTO items VALUES (200, 'after', 1);",
        )
        .await
        .unwrap();
    let read = steps_of(&mut first, 12).await;
    let continues: Vec<bool> = read.iter().map(|(s, _)| s.unit_continues).collect();
    assert_eq!(continues, [true, true, false, false], "{read:?}");
    let sizes: Vec<usize> = read.iter().map(|(s, _)| s.records).collect();
    assert_eq!(sizes, [4, 4, 3, 1]);
    let all: Vec<Value> = read.iter().flat_map(|(_, d)| d.clone()).collect();
    let c = |t: &str, id: i64, op: &str| (t.to_string(), id, op.to_string());
    let mut expected: Vec<_> = (100..=104).map(|id| c("items", id, "c")).collect();
    expected.extend((1..=4).map(|id| c("orders", id, "c")));
    expected.extend([
        c("items", 1, "u"),
        c("orders", 2, "d"),
        c("items", 200, "c"),
    ]);
    assert_eq!(changes(&all), expected);
    let lsn = &all[0]["_meta"]["lsn"];
    assert!(
        all[..11].iter().all(|d| &d["_meta"]["lsn"] == lsn),
        "{all:?}"
    );
    let unit: Vec<(Step, Vec<Value>)> = read[..3].to_vec();
    first.disconnect().await;
    drop(first);

    // Each part alone on a fresh source, decoding parts of another size than the
    // first run (the whole transaction at once, parts of 3, of 1).
    for ((step, docs), part_docs) in unit.iter().zip([None, Some(3), Some(1)]) {
        let mut fresh = source(&config);
        if let Some(n) = part_docs {
            fresh.set_part_docs(n);
        }
        let mut out = Records::default();
        let replayed = fresh.replay(&step.resume, &mut out).await.unwrap();
        assert_eq!(replayed.resume, step.resume, "same position and hash");
        assert_eq!(replayed.unit_continues, step.unit_continues);
        assert_eq!(&parsed_docs(&mut out), docs);
        fresh.disconnect().await;
    }

    // A position inside the unit is never checkpointed: seeking it is refused.
    let mid = unit[0].0.resume.position().unwrap();
    let err = source(&config).seek(mid).await.unwrap_err();
    assert!(matches!(err, SourceError::BadResume { .. }), "{err}");

    // After a crash with the unit journaled: its parts replay one after another on
    // one stream, and reading goes on after it.
    let mut second = source(&config);
    second.seek(&before).await.unwrap();
    for (step, docs) in &unit {
        let mut out = Records::default();
        let replayed = second.replay(&step.resume, &mut out).await.unwrap();
        assert_eq!(replayed.resume, step.resume);
        assert_eq!(&parsed_docs(&mut out), docs);
    }
    let after = steps_of(&mut second, 1).await;
    assert_eq!(changes(&after[0].1), [c("items", 200, "c")]);
    second.disconnect().await;

    // A crash before the unit's intent: a restart at the position before it reads
    // it again whole, as the same parts.
    let mut third = source(&config);
    third.set_part_docs(4);
    third.seek(&before).await.unwrap();
    let again = steps_of(&mut third, 12).await;
    let resumes = |steps: &[(Step, Vec<Value>)]| -> Vec<Resume> {
        steps.iter().map(|(s, _)| s.resume.clone()).collect()
    };
    assert_eq!(resumes(&again), resumes(&read));
    let again: Vec<Value> = again.into_iter().flat_map(|(_, d)| d).collect();
    assert_eq!(again, all);
}
