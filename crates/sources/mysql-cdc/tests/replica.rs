//! One replica per server id: what a cluster's failover of the source's shard relies
//! on. Every member derives the same server id from the names, so the new holder's
//! stream ends a former holder's on the server; the ended stream fails with a
//! retryable error naming the id (not as a purged position, which shares its error
//! code), and the new one streams on.

mod common;

use common::{catch_up, fold, run, shop, source, table_rows, until};
use sluice_source_sdk::testing::records;
use sluice_source_sdk::{Records, Source, SourceError};
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_newer_stream_with_the_same_server_id_ends_the_older_one_with_a_retryable_error() {
    let (_server, mut conn, config) = shop(2).await;
    let mut former = source(&config);
    catch_up(&mut former).await;
    let mut holder = source(&config);
    let (mut docs, _) = catch_up(&mut holder).await;
    run(&mut conn, "INSERT INTO shop.items VALUES (3, 'c', 30)").await;
    let started = Instant::now();
    let error = loop {
        match former.queue(records(10), &mut Records::default()).await {
            Err(error) => break error,
            Ok(_) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "the former stream was not ended"
            ),
        }
        tokio::time::timeout(Duration::from_millis(200), former.ready())
            .await
            .ok();
    };
    assert!(matches!(error, SourceError::Io { .. }), "{error}");
    assert!(error.is_retryable(), "{error}");
    let id = config.server_id("test", "cdc");
    let text = error.to_string();
    assert!(
        text.contains(&format!("server_id {id}")) && text.contains("cluster"),
        "{text}"
    );
    // The newer stream reads on.
    let mut steps = Vec::new();
    until(&mut holder, 10, &mut docs, &mut steps, |docs, _| {
        fold(docs).len() == 3
    })
    .await;
    assert_eq!(fold(&docs), table_rows(&mut conn).await);
}
