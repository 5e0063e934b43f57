//! Positions by GTID (MariaDB `domain-server-seq`): a streamed step records the
//! server's GTID state, and a restart connects by it, so the file and offset it also
//! records need not exist on the server it resumes against: a replica promoted after
//! its primary died, whose binary log has files and offsets of its own, resumes with
//! nothing lost and nothing twice. A state the server's logs no longer reach is
//! refused as purged.

mod common;

use common::*;
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_source_sdk::{Source, SourceError};
use sluice_testkit::mariadb::BinlogMariadb;

/// The last position of `steps` that holds documents (the one a commit records).
fn committed(steps: &[sluice_source_sdk::Step]) -> Value {
    position(steps.iter().rev().find(|s| s.records > 0).unwrap())
}

async fn gtid_binlog_pos(conn: &mut mysql_async::Conn) -> String {
    conn.query_first("SELECT @@GLOBAL.gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_restart_connects_by_gtid_whatever_file_and_offset_the_position_names() {
    let (_server, mut conn, config) = shop(3).await;
    let mut first = source(&config);
    let (mut docs, mut steps) = catch_up(&mut first).await;
    run(&mut conn, "INSERT INTO shop.items VALUES (4, 'four', 4)").await;
    until(&mut first, 10, &mut docs, &mut steps, |d, _| d.len() >= 4).await;
    first.disconnect().await;
    let last = committed(&steps);
    assert_eq!(last["phase"], "stream");
    assert_eq!(
        last["gtid_state"],
        json!(gtid_binlog_pos(&mut conn).await),
        "the state after the step is the server's after its last transaction: {last}"
    );
    // The same state with a file and offset this server never had: as after a
    // failover to a server whose log has another layout.
    let mut elsewhere = last.clone();
    elsewhere["begin"] = json!({"file": "mysql-bin.000099", "pos": 4});
    elsewhere["end"] = json!({"file": "mysql-bin.000099", "pos": 4});
    run(
        &mut conn,
        "FLUSH BINARY LOGS; INSERT INTO shop.items VALUES (5, 'five', 5); \
         DELETE FROM shop.items WHERE id = 1",
    )
    .await;
    let mut second = source(&config);
    second.seek(&elsewhere).await.unwrap();
    let (mut after, mut s2) = (Vec::new(), Vec::new());
    until(&mut second, 10, &mut after, &mut s2, |d, s| {
        d.len() >= 2 && s.end_of_input
    })
    .await;
    let changes: Vec<_> = after
        .iter()
        .map(|d| (d["_meta"]["op"].clone(), d["id"].clone()))
        .collect();
    assert_eq!(changes, [(json!("c"), json!(5)), (json!("d"), json!(1))]);
    // The next position is this server's own again.
    let next = committed(&s2);
    assert_ne!(next["end"]["file"], "mysql-bin.000099", "{next}");
    assert_eq!(next["gtid_state"], json!(gtid_binlog_pos(&mut conn).await));
    // Without a GTID state, the file and offset are all there is: refused.
    elsewhere.as_object_mut().unwrap().remove("gtid_state");
    let error = source(&config).seek(&elsewhere).await.unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
}

#[tokio::test]
async fn a_gtid_state_the_logs_no_longer_reach_is_refused_as_purged() {
    let (_server, mut conn, config) = shop(2).await;
    let mut first = source(&config);
    let (mut docs, mut steps) = catch_up(&mut first).await;
    run(&mut conn, "INSERT INTO shop.items VALUES (3, 'c', 3)").await;
    until(&mut first, 10, &mut docs, &mut steps, |d, _| d.len() >= 3).await;
    first.disconnect().await;
    let mut stale = committed(&steps);
    assert!(stale["gtid_state"].is_string(), "{stale}");
    // Purge everything up to a new log: the state is now older than the oldest log's.
    run(
        &mut conn,
        "INSERT INTO shop.items VALUES (4, 'd', 4); FLUSH BINARY LOGS",
    )
    .await;
    let newest = purge_to_newest(&mut conn).await;
    // Keep the file name this server has, so only the GTID state can tell.
    stale["end"]["file"] = json!(newest);
    let error = source(&config).seek(&stale).await.unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("GTID state") && text.contains("Start over"),
        "{text}"
    );
}

/// A primary and a replica (`log_slave_updates`, its own log files: it flushed its
/// logs twice first). The source reads the primary; the primary dies; the replica is
/// promoted and written to; the source resumes on it from its last position.
#[tokio::test]
async fn after_a_failover_to_a_promoted_replica_the_source_resumes_exactly() {
    let primary = BinlogMariadb::start();
    let replica = BinlogMariadb::start_with(&["--server-id=2", "--log-slave-updates"]);
    let mut on_replica = sql(&replica).await;
    on_replica
        .query_drop(format!(
            "FLUSH BINARY LOGS; FLUSH BINARY LOGS; CHANGE MASTER TO MASTER_HOST='127.0.0.1', \
             MASTER_PORT={}, MASTER_USER='root', MASTER_USE_GTID=slave_pos; START SLAVE",
            primary.port
        ))
        .await
        .unwrap();
    let mut on_primary = sql(&primary).await;
    items(&mut on_primary, 4).await;
    let mut first = source(&config(&primary, &["shop.items"]));
    let (mut docs, mut steps) = catch_up(&mut first).await;
    on_primary
        .query_drop(
            "INSERT INTO shop.items VALUES (5, 'five', 5); \
             UPDATE shop.items SET qty = 0 WHERE id = 2",
        )
        .await
        .unwrap();
    until(&mut first, 10, &mut docs, &mut steps, |d, _| d.len() >= 6).await;
    first.disconnect().await;
    let last = committed(&steps);
    // The replica holds all of it, then the primary dies and the replica is promoted.
    let state = gtid_binlog_pos(&mut on_primary).await;
    let waited: i64 = on_replica
        .query_first(format!("SELECT MASTER_GTID_WAIT('{state}', 30)"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        waited,
        0,
        "the replica did not catch up:\n{}",
        replica.log()
    );
    drop(on_primary);
    drop(primary);
    on_replica
        .query_drop(
            "STOP SLAVE; RESET SLAVE ALL; \
             INSERT INTO shop.items VALUES (6, 'six', 6); \
             DELETE FROM shop.items WHERE id = 3",
        )
        .await
        .unwrap();
    let layout: Option<mysql_async::Row> =
        on_replica.query_first("SHOW MASTER STATUS").await.unwrap();
    let replica_file: String = layout.unwrap().get(0).unwrap();
    assert_ne!(
        json!(replica_file),
        last["end"]["file"],
        "the replica's log must have a layout of its own"
    );
    let mut second = source(&config(&replica, &["shop.items"]));
    second.seek(&last).await.unwrap();
    until(&mut second, 10, &mut docs, &mut steps, |d, s| {
        d.len() >= 8 && s.end_of_input
    })
    .await;
    let tail: Vec<_> = docs[6..]
        .iter()
        .map(|d| (d["_meta"]["op"].clone(), d["id"].clone()))
        .collect();
    assert_eq!(tail, [(json!("c"), json!(6)), (json!("d"), json!(3))]);
    assert_eq!(fold(&docs), table_rows(&mut on_replica).await);
}
