//! The source against a real MariaDB with the binary log on (a private `mariadbd` per
//! test, [`BinlogMariadb`]): a snapshot of a table written while it is read, streamed
//! inserts, updates and deletes folded by key equal to the table, every type's JSON
//! from the snapshot and from the binlog, an exact replay (and a refused one), a
//! restart that resumes exactly (mid-stream, mid-snapshot, composite integer keys; other
//! keys in `keys.rs`; JSON keys read whole), large transactions in parts of one unit, quiet steps past uncaptured
//! traffic, the lag across log files, DDL (added columns flow through, the rest stops
//! the source), a purged position, and the named errors (server settings, privileges,
//! keys).

use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_mysql_cdc::MysqlCdcConfig;
use sluice_source_sdk::testing::{parsed_docs, records};
use sluice_source_sdk::{Lag, Records, Resume, Source, SourceError, Step};
use sluice_testkit::mariadb::BinlogMariadb;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;

use common::*;

#[tokio::test]
async fn a_snapshot_written_during_it_then_inserts_updates_deletes_fold_to_the_table() {
    let (_server, mut conn, config) = shop(10).await;
    let mut source = source(&config);
    let (mut docs, first) = step(&mut source, 3).await;
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[0]["_meta"]["op"], "r");
    // Written while the snapshot is being read: behind it, ahead of it, new, gone.
    run(
        &mut conn,
        "UPDATE shop.items SET qty = 1 WHERE id = 2; \
         UPDATE shop.items SET qty = 2 WHERE id = 9; \
         INSERT INTO shop.items VALUES (11, 'eleven', 11); \
         DELETE FROM shop.items WHERE id = 5",
    )
    .await;
    let mut steps = vec![first];
    until(&mut source, 3, &mut docs, &mut steps, caught_up).await;
    assert_eq!(fold(&docs), table_rows(&mut conn).await);
    // Streamed: a transaction of several changes, an update of the key, a delete.
    run(
        &mut conn,
        "START TRANSACTION; \
         INSERT INTO shop.items VALUES (20, 'twenty', 20), (21, 'x', NULL); \
         UPDATE shop.items SET name = 'renamed' WHERE id = 1; \
         COMMIT; \
         UPDATE shop.items SET id = 30 WHERE id = 3; \
         DELETE FROM shop.items WHERE id = 4",
    )
    .await;
    let want = table_rows(&mut conn).await;
    until(&mut source, 100, &mut docs, &mut steps, |d, _| {
        fold(d) == want
    })
    .await;
    let ops: Vec<&str> = docs
        .iter()
        .filter_map(|d| d["_meta"]["op"].as_str())
        .collect();
    for op in ["r", "c", "u", "d"] {
        assert!(ops.contains(&op), "no {op} in {ops:?}");
    }
    let streamed = docs.iter().find(|d| d["_meta"]["op"] == "c").unwrap();
    assert!(
        streamed["_meta"]["gtid"]
            .as_str()
            .unwrap()
            .starts_with("0-1-")
    );
    assert_eq!(
        streamed["_meta"]["source"],
        json!({"schema": "shop", "table": "items"})
    );
}

#[tokio::test]
async fn every_type_reads_the_same_from_the_snapshot_and_the_binlog() {
    let server = BinlogMariadb::start();
    let mut conn = sql(&server).await;
    run(
        &mut conn,
        "CREATE DATABASE t; CREATE TABLE t.types (id INT PRIMARY KEY, \
         ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, \
         mi MEDIUMINT, mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, \
         bi BIGINT, bu BIGINT UNSIGNED, f FLOAT, d DOUBLE, dec1 DECIMAL(10,2), \
         dec2 DECIMAL(30,5), y YEAR, dt DATE, dtm DATETIME(3), ts TIMESTAMP(6) NULL, \
         tm TIME(3), c CHAR(5), vc VARCHAR(20), tx TEXT, bn BINARY(3), vb VARBINARY(8), \
         bl BLOB, j JSON, e ENUM('small','large'), s SET('x','y','z'), b1 BIT(1), \
         b9 BIT(9), nul INT, l1 VARCHAR(10) CHARACTER SET latin1)",
    )
    .await;
    let values = "-128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, \
         -9223372036854775808, 18446744073709551615, 1.5, 0.1, 12.50, \
         1234567890123456789012345.12345, 2024, '2024-02-29', '2024-01-02 03:04:05.120', \
         '2024-01-02 03:04:05.000001', '-838:59:59.5', 'ab', 'héllo', 'long text', \
         x'0102', x'ff00', x'deadbeef', '{\"a\": [1, 2.5, null]}', 'large', 'x,z', b'1', \
         b'100000001', NULL, 'hé€!'";
    run(&mut conn, "SET time_zone = '+00:00'").await;
    run(
        &mut conn,
        &format!("INSERT INTO t.types VALUES (1, {values})"),
    )
    .await;
    let mut source = source(&config(&server, &["t.types"]));
    let (mut docs, mut steps) = catch_up(&mut source).await;
    run(
        &mut conn,
        &format!("INSERT INTO t.types VALUES (2, {values})"),
    )
    .await;
    until(&mut source, 10, &mut docs, &mut steps, |d, _| d.len() >= 2).await;
    let strip = |doc: &Value| {
        let mut doc = doc.clone();
        let object = doc.as_object_mut().unwrap();
        object.remove("_meta");
        object.remove("id");
        doc
    };
    let (snapshot, streamed) = (strip(&docs[0]), strip(&docs[1]));
    let expected = json!({
        "ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608, "mu": 16777215,
        "i": -2147483648i64, "iu": 4294967295u64, "bi": i64::MIN, "bu": u64::MAX,
        "f": 1.5, "d": 0.1, "dec1": 12.5, "dec2": "1234567890123456789012345.12345",
        "y": 2024, "dt": "2024-02-29", "dtm": "2024-01-02T03:04:05.12",
        "ts": "2024-01-02T03:04:05.000001Z", "tm": "-838:59:59.5", "c": "ab",
        "vc": "héllo", "tx": "long text", "bn": "AQIA", "vb": "/wA=", "bl": "3q2+7w==",
        "j": {"a": [1, 2.5, null]}, "e": "large", "s": "x,z", "b1": true, "b9": 257,
        "nul": null, "l1": "hé€!"
    });
    for (column, want) in expected.as_object().unwrap() {
        assert_eq!(&snapshot[column], want, "{column} from the snapshot");
        assert_eq!(&streamed[column], want, "{column} from the binlog");
    }
    assert_eq!(snapshot, streamed);
}

#[tokio::test]
async fn a_replayed_step_is_exact_and_a_restart_resumes_exactly() {
    let (_server, mut conn, config) = shop(4).await;
    let mut first = source(&config);
    let (mut docs, mut steps) = catch_up(&mut first).await;
    run(
        &mut conn,
        "INSERT INTO shop.items VALUES (5, 'five', 5); \
         UPDATE shop.items SET qty = 0 WHERE id = 1; \
         DELETE FROM shop.items WHERE id = 2",
    )
    .await;
    let n = docs.len();
    until(&mut first, 2, &mut docs, &mut steps, |d, _| {
        d.len() >= n + 3
    })
    .await;
    // The first streamed step, replayed by a new instance: the same documents, then
    // the rest follows, nothing twice.
    let at = steps
        .iter()
        .position(|s| s.records > 0 && position(s)["phase"] == "stream")
        .unwrap();
    let streamed = steps[at].clone();
    let before: usize = steps[..at].iter().map(|s| s.records).sum();
    let mut second = source(&config);
    let mut out = Records::default();
    let replayed = second.replay(&streamed.resume, &mut out).await.unwrap();
    assert_eq!(replayed.resume.hash(), streamed.resume.hash());
    let again = parsed_docs(&mut out);
    assert_eq!(again, docs[before..before + streamed.records]);
    assert_eq!(again[0]["id"], 5);
    let left = docs.len() - before - streamed.records;
    let (mut rest, mut more) = (Vec::new(), Vec::new());
    until(&mut second, 10, &mut rest, &mut more, |d, s| {
        d.len() >= left && s.end_of_input
    })
    .await;
    assert_eq!(rest, docs[before + streamed.records..]);
    // A restart at the last committed position reads only what came after it.
    let last = position(steps.last().unwrap());
    let mut third = source(&config);
    third.seek(&last).await.unwrap();
    run(&mut conn, "INSERT INTO shop.items VALUES (6, 'six', 6)").await;
    let (mut after, mut s3) = (Vec::new(), Vec::new());
    until(&mut third, 10, &mut after, &mut s3, |d, _| !d.is_empty()).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["id"], 6);
    // A step whose hash differs is refused.
    let Resume::Replay { position, data, .. } = streamed.resume.clone() else {
        unreachable!()
    };
    let forged = Resume::Replay {
        position,
        data,
        hash: streamed.resume.hash() ^ 1,
    };
    let error = source(&config)
        .replay(&forged, &mut Records::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error, SourceError::ReplayMismatch { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn a_restart_mid_snapshot_resumes_after_the_last_committed_chunk() {
    let (_server, mut conn, config) = shop(10).await;
    let mut first = source(&config);
    let (mut docs, committed) = step(&mut first, 3).await;
    drop(first);
    // Changes on both sides of the committed key, while no one reads.
    run(
        &mut conn,
        "UPDATE shop.items SET qty = 100 WHERE id = 1; \
         UPDATE shop.items SET qty = 900 WHERE id = 9; \
         DELETE FROM shop.items WHERE id = 7",
    )
    .await;
    let mut second = source(&config);
    second.seek(&position(&committed)).await.unwrap();
    let mut steps = Vec::new();
    until(&mut second, 3, &mut docs, &mut steps, caught_up).await;
    assert_eq!(fold(&docs), table_rows(&mut conn).await);
    // Id 9 was read in the second snapshot, with its change: not streamed again.
    let nines = docs.iter().filter(|d| d["id"] == 9).count();
    assert_eq!(nines, 1, "{docs:?}");
}

#[tokio::test]
async fn a_purged_position_says_how_to_start_over() {
    let (_server, mut conn, config) = shop(2).await;
    let mut first = source(&config);
    let (_, steps) = catch_up(&mut first).await;
    let committed = position(steps.last().unwrap());
    first.disconnect().await;
    run(
        &mut conn,
        "FLUSH BINARY LOGS; INSERT INTO shop.items VALUES (3, 'c', 3); FLUSH BINARY LOGS",
    )
    .await;
    purge_to_newest(&mut conn).await;
    let error = source(&config).seek(&committed).await.unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("purged") && text.contains("Start over"),
        "{text}"
    );
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn errors_name_what_to_change() {
    let (server, mut conn, items) =
        shop_on(BinlogMariadb::start_with(&["--binlog-format=STATEMENT"]), 1).await;
    run(&mut conn, "CREATE TABLE shop.loose (a INT)").await;
    let error = source(&items).probe().await.unwrap_err();
    assert!(error.to_string().contains("binlog_format=ROW"), "{error}");
    run(&mut conn, "SET GLOBAL binlog_format = 'ROW'").await;
    let error = source(&config(&server, &["shop.loose"]))
        .probe()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no primary key"), "{error}");
    let error = source(&config(&server, &["shop.nope"]))
        .probe()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("does not exist"), "{error}");
    source(&items).probe().await.unwrap();
    drop(server);
    for (options, needle) in [
        (["--binlog-row-image=MINIMAL"], "binlog_row_image=FULL"),
        (["--skip-log-bin"], "log_bin=mysql-bin"),
    ] {
        let (_server, _conn, config) = shop_on(BinlogMariadb::start_with(&options), 1).await;
        let error = source(&config).probe().await.unwrap_err();
        assert!(error.to_string().contains(needle), "{options:?}: {error}");
        assert!(!error.is_retryable());
    }
}

#[tokio::test]
async fn added_columns_flow_through_and_other_ddl_stops_the_source_naming_it() {
    let (_server, mut conn, config) = shop(1).await;
    let mut source = source(&config);
    let (mut docs, mut steps) = catch_up(&mut source).await;
    run(
        &mut conn,
        "ALTER TABLE shop.items ADD COLUMN note VARCHAR(10) DEFAULT 'n'; \
         INSERT INTO shop.items (id, name, qty, note) VALUES (2, 'two', 2, 'hi')",
    )
    .await;
    until(&mut source, 10, &mut docs, &mut steps, |d, _| d.len() >= 2).await;
    assert_eq!(docs[1]["note"], "hi");
    run(&mut conn, "ALTER TABLE shop.items DROP COLUMN qty").await;
    let started = Instant::now();
    let error = loop {
        let mut out = Records::default();
        match source.queue(records(10), &mut out).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(started.elapsed() < Duration::from_secs(30), "no error");
                tokio::time::timeout(Duration::from_millis(200), source.ready())
                    .await
                    .ok();
            }
        }
    };
    let text = error.to_string();
    assert!(
        text.contains("shop.items") && text.contains("DROP COLUMN qty"),
        "{text}"
    );
}

#[tokio::test]
async fn a_user_without_replication_privileges_is_told_what_to_grant() {
    let (server, mut conn, _) = shop_on(BinlogMariadb::start_with_grants(), 1).await;
    run(
        &mut conn,
        "CREATE USER reader@'127.0.0.1'; GRANT SELECT ON shop.* TO reader@'127.0.0.1'",
    )
    .await;
    let url = format!("mysql://reader@127.0.0.1:{}", server.port);
    let config: MysqlCdcConfig =
        sluice_source_sdk::config::parse(json!({"url": url, "tables": ["shop.items"]})).unwrap();
    let error = source(&config).probe().await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("REPLICATION SLAVE") && text.contains("GRANT"),
        "{text}"
    );
    assert!(!error.is_retryable());
    // REPLICATION CLIENT alone reads the log's position, not the log.
    run(
        &mut conn,
        "GRANT REPLICATION CLIENT ON *.* TO reader@'127.0.0.1'",
    )
    .await;
    let error = source(&config).probe().await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("REPLICATION SLAVE"), "{text}");
    run(
        &mut conn,
        "GRANT REPLICATION SLAVE ON *.* TO reader@'127.0.0.1'",
    )
    .await;
    let mut source = source(&config);
    source.probe().await.unwrap();
    let (mut docs, mut steps) = catch_up(&mut source).await;
    run(&mut conn, "INSERT INTO shop.items VALUES (2, 'two', 2)").await;
    until(&mut source, 10, &mut docs, &mut steps, |d, _| d.len() >= 2).await;
    assert_eq!(docs[1]["_meta"]["op"], "c");
}

#[tokio::test]
async fn a_large_transaction_comes_in_parts_of_one_unit_that_replay_exactly() {
    let (_server, mut conn, config) = shop(1).await;
    let mut first = source(&config);
    first.set_part_docs(2);
    let (mut docs, mut steps) = catch_up(&mut first).await;
    let n = (docs.len(), steps.len());
    run(
        &mut conn,
        "START TRANSACTION; \
         INSERT INTO shop.items VALUES (2, 'b', 2), (3, 'c', 3), (4, 'd', 4); \
         UPDATE shop.items SET qty = 0 WHERE id < 4; \
         COMMIT; \
         INSERT INTO shop.items VALUES (9, 'after', 9)",
    )
    .await;
    until(&mut first, 100, &mut docs, &mut steps, |d, _| {
        d.len() >= n.0 + 7
    })
    .await;
    let unit: Vec<&Step> = steps[n.1..]
        .iter()
        .filter(|s| s.records > 0 || s.advances)
        .collect();
    // 3 inserts and 3 updates, a rows event each: a part once 2 or more are held, so
    // parts of 3, 3 and an empty last part (which ends the unit), then the insert
    // after it, on its own.
    let continues: Vec<bool> = unit.iter().map(|s| s.unit_continues).collect();
    assert_eq!(continues, [true, true, false, false], "{unit:?}");
    assert!(unit[2].advances && unit[2].records == 0);
    assert_eq!(fold(&docs), table_rows(&mut conn).await);
    // Each part replays exactly on a new instance; a mid-unit position is never sought.
    let mut at = n.0;
    for step in &unit {
        let mut again = source(&config);
        let mut out = Records::default();
        let replayed = again.replay(&step.resume, &mut out).await.unwrap();
        assert_eq!(replayed.resume.hash(), step.resume.hash());
        assert_eq!(replayed.unit_continues, step.unit_continues);
        assert_eq!(parsed_docs(&mut out), docs[at..at + step.records]);
        at += step.records;
    }
    let error = source(&config).seek(&position(unit[0])).await.unwrap_err();
    assert!(matches!(error, SourceError::BadResume { .. }), "{error}");
    // After replaying a middle part, the rest of the unit follows, then what came after.
    let mut again = source(&config);
    again
        .replay(&unit[1].resume, &mut Records::default())
        .await
        .unwrap();
    let from = n.0 + unit[0].records + unit[1].records;
    let (mut rest, mut more) = (Vec::new(), Vec::new());
    until(&mut again, 100, &mut rest, &mut more, |d, s| {
        d.len() >= docs.len() - from && s.end_of_input
    })
    .await;
    assert_eq!(rest, docs[from..]);
    let moved = more.iter().find(|s| s.advances || s.records > 0).unwrap();
    assert!(
        moved.advances && !moved.unit_continues,
        "the unit's empty last part"
    );
}

#[tokio::test]
async fn quiet_tables_still_move_the_position_so_purged_old_logs_do_not_matter() {
    let (_server, mut conn, config) = shop(1).await;
    run(&mut conn, "CREATE TABLE shop.other (id INT PRIMARY KEY)").await;
    let mut first = source(&config);
    let (mut docs, mut steps) = catch_up(&mut first).await;
    // Only a table not captured is written, in a new log file.
    run(
        &mut conn,
        "FLUSH BINARY LOGS; INSERT INTO shop.other VALUES (1)",
    )
    .await;
    let started = Instant::now();
    until(&mut first, 10, &mut docs, &mut steps, |_, s| s.advances).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    let quiet = steps.last().unwrap().clone();
    assert_eq!(quiet.records, 0);
    let moved = position(&quiet);
    assert_eq!(moved["quiet"], true);
    assert_eq!(moved["end"]["file"], "mysql-bin.000002", "{moved}");
    // The quiet step replays (no documents), and the older log can go.
    let mut out = Records::default();
    let replayed = source(&config)
        .replay(&quiet.resume, &mut out)
        .await
        .unwrap();
    assert!(replayed.advances && out.is_empty());
    first.disconnect().await;
    let started = Instant::now();
    loop {
        run(&mut conn, "PURGE BINARY LOGS TO 'mysql-bin.000002'").await;
        let first: Option<mysql_async::Row> = conn.query_first("SHOW BINARY LOGS").await.unwrap();
        if first.and_then(|r| r.get::<String, _>(0)).as_deref() == Some("mysql-bin.000002") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "logs not purged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut second = source(&config);
    second.seek(&moved).await.unwrap();
    run(&mut conn, "INSERT INTO shop.items VALUES (2, 'two', 2)").await;
    let (mut after, mut more) = (Vec::new(), Vec::new());
    until(&mut second, 10, &mut after, &mut more, |d, _| !d.is_empty()).await;
    assert_eq!(after[0]["id"], 2);
}

#[tokio::test]
async fn the_lag_counts_the_binary_log_not_yet_read_across_files() {
    let (_server, mut conn, config) = shop(1).await;
    let mut source = source(&config);
    let (mut docs, mut steps) = catch_up(&mut source).await;
    assert_eq!(source.lag(), Some(Lag::Bytes(0)));
    source.pause();
    // Written while the source does not read (paused), over a rotation.
    run(
        &mut conn,
        "INSERT INTO shop.items VALUES (2, REPEAT('x', 5000), 2); FLUSH BINARY LOGS; \
         INSERT INTO shop.items VALUES (3, REPEAT('y', 5000), 3)",
    )
    .await;
    let started = Instant::now();
    while !matches!(source.lag(), Some(Lag::Bytes(n)) if n > 10_000) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            source.lag()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    source.extend();
    until(&mut source, 10, &mut docs, &mut steps, |d, s| {
        d.len() >= 3 && s.end_of_input
    })
    .await;
    // Read on (as the runtime does): the heartbeats move past the rotation's events.
    let started = Instant::now();
    while source.lag() != Some(Lag::Bytes(0)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            source.lag()
        );
        assert!(step(&mut source, 10).await.0.is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
/// Integer keys, and the one key that is not a chunk's bound (a JSON column's, which its
/// documents re-serialize: `crate::key`); the other keys are `keys.rs`'s.
async fn composite_integer_keys_are_chunked_and_json_keys_read_whole() {
    let server = BinlogMariadb::start();
    let mut conn = sql(&server).await;
    run(
        &mut conn,
        "CREATE DATABASE k; \
         CREATE TABLE k.pairs (a INT, b BIGINT UNSIGNED, v INT, PRIMARY KEY (a, b)); \
         INSERT INTO k.pairs VALUES (1, 1, 0), (1, 2, 0), (1, 18446744073709551615, 0), \
           (2, 0, 0), (2, 5, 0), (3, 1, 0), (-1, 7, 0); \
         CREATE TABLE k.named (code JSON, v INT, PRIMARY KEY (code(20))); \
         INSERT INTO k.named VALUES ('\"b\"', 1), ('\"a\"', 2), ('\"c\"', 3), ('\"d\"', 4)",
    )
    .await;
    let config = config(&server, &["k.pairs", "k.named"]);
    let mut first = source(&config);
    let (mut docs, first_step) = step(&mut first, 3).await;
    assert_eq!(docs.len(), 3);
    drop(first);
    // Changes on both sides of the committed key, and in the table read whole.
    run(
        &mut conn,
        "UPDATE k.pairs SET v = 1 WHERE a = 1 AND b = 1; \
         UPDATE k.pairs SET v = 1 WHERE a = 3; \
         UPDATE k.named SET v = 9 WHERE code = '\"a\"'",
    )
    .await;
    let mut second = source(&config);
    second.seek(&position(&first_step)).await.unwrap();
    let mut steps = Vec::new();
    let from = docs.len();
    until(&mut second, 3, &mut docs, &mut steps, caught_up).await;
    // The table read whole is one step of its four rows, past the step's 3.
    assert!(
        steps
            .iter()
            .any(|s| s.records == 4 && docs[from..].iter().any(|d| d["code"] == "c")),
        "{steps:?}"
    );
    let mut pairs = BTreeMap::new();
    let mut named = BTreeMap::new();
    for doc in &docs {
        match doc["_meta"]["source"]["table"].as_str().unwrap() {
            "pairs" => {
                pairs.insert(
                    (doc["a"].to_string(), doc["b"].to_string()),
                    doc["v"].clone(),
                );
            }
            _ => {
                named.insert(doc["code"].as_str().unwrap().to_string(), doc["v"].clone());
            }
        }
    }
    assert_eq!(pairs.len(), 7, "{docs:?}");
    assert_eq!(pairs[&("1".into(), "1".into())], 1);
    assert_eq!(pairs[&("3".into(), "1".into())], 1);
    assert_eq!(pairs[&("1".into(), "18446744073709551615".into())], 0);
    assert_eq!(named["a"], 9);
    // Each change exactly once: (1, 1) was read before its change, which is streamed;
    // the snapshot after the restart already held the other two.
    let updates: Vec<&Value> = docs.iter().filter(|d| d["_meta"]["op"] == "u").collect();
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(
        (updates[0]["a"].clone(), updates[0]["b"].clone()),
        (json!(1), json!(1))
    );
}
