//! Both connections of the source over TLS, against a private cluster with
//! `wal_level=logical` that takes TLS only (`hostssl` alone in pg_hba.conf,
//! [`LogicalPostgres::start_tls`]), its certificate naming `localhost` only:
//! `verify-full` with the right CA snapshots and streams; another CA, or a host the
//! certificate does not name, fails naming the certificate problem (for another CA,
//! the issuer, in `verify-ca` too) and the options, not retryable; a plain connection is refused by the server, in its words.

use serde_json::{Value, json};
use sluice_postgres_cdc::{PostgresCdcConfig, PostgresCdcSource};
use sluice_source_sdk::testing::{parsed_docs, records};
use sluice_source_sdk::{Records, Source, SourceError};
use sluice_testkit::postgres::LogicalPostgres;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// A private TLS-only cluster with a table `items` of ids 1..=3.
async fn cluster() -> (LogicalPostgres, tokio_postgres::Client) {
    let pg = LogicalPostgres::start_tls();
    let (client, connection) = tokio_postgres::connect(&pg.socket(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE items (id bigint PRIMARY KEY, name text);
             INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 3) g;",
        )
        .await
        .unwrap();
    (pg, client)
}

/// The source of `items` at `host` with the URL options `query`, in slot `slot`.
fn source(pg: &LogicalPostgres, host: &str, query: &str, slot: &str) -> PostgresCdcSource {
    let url = format!("postgres://postgres@{host}:{}/postgres?{query}", pg.port);
    let value = json!({"url": url, "tables": ["public.items"], "slot": slot});
    let config: PostgresCdcConfig = sluice_source_sdk::config::parse(value).unwrap();
    config.check().unwrap();
    PostgresCdcSource::new("cdc", "test", &config).unwrap()
}

fn file(pg: &LogicalPostgres, name: &str) -> String {
    pg.certificates.as_ref().unwrap().file(name)
}

/// Steps until `n` documents were read; each as its operation and id (`r1`, `d4`).
async fn read(source: &mut PostgresCdcSource, n: usize) -> Vec<String> {
    let (mut docs, started) = (Vec::<Value>::new(), Instant::now());
    while docs.len() < n {
        assert!(started.elapsed() < Duration::from_secs(60), "{docs:?}");
        let mut out = Records::default();
        let step = source.queue(records(100), &mut out).await.unwrap();
        docs.extend(parsed_docs(&mut out));
        if step.records == 0 {
            tokio::time::timeout(Duration::from_millis(200), source.ready())
                .await
                .ok();
        }
    }
    (docs.iter())
        .map(|d| format!("{}{}", d["_meta"]["op"].as_str().unwrap(), d["id"]))
        .collect()
}

/// The first error of reading, which must not be retryable; its message.
async fn permanent(mut source: PostgresCdcSource) -> String {
    let mut out = Records::default();
    match source.queue(records(100), &mut out).await {
        Err(e @ SourceError::Config { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            e.to_string()
        }
        Err(e) => panic!("expected a configuration error, got {e:?}"),
        Ok(step) => panic!("expected an error, read {} records", step.records),
    }
}

#[tokio::test]
async fn verify_full_with_the_ca_snapshots_and_streams_over_tls() {
    let (pg, client) = cluster().await;
    let query = format!("sslmode=verify-full&sslrootcert={}", file(&pg, "ca.crt"));
    let mut cdc = source(&pg, "localhost", &query, "full");
    let snapshot = read(&mut cdc, 3).await;
    assert_eq!(snapshot, ["r1", "r2", "r3"]);
    client
        .batch_execute("INSERT INTO items VALUES (4, 'new'); DELETE FROM items WHERE id = 1;")
        .await
        .unwrap();
    let streamed = read(&mut cdc, 2).await;
    assert_eq!(streamed, ["c4", "d1"]);
    // Both connections are encrypted: the server says so of each of its backends.
    let rows = client
        .query(
            "SELECT backend_type, s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a \
             USING (pid) WHERE a.client_addr IS NOT NULL ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(seen.contains(&("walsender".into(), true)), "{seen:?}");
    assert!(seen.iter().all(|(_, ssl)| *ssl), "{seen:?}");
}

#[tokio::test]
async fn certificates_that_do_not_verify_fail_naming_the_problem_and_the_options() {
    let (pg, _client) = cluster().await;
    let other_ca = file(&pg, "other-ca.crt");
    let wrong_ca = format!("sslmode=verify-full&sslrootcert={other_ca}");
    let err = permanent(source(&pg, "localhost", &wrong_ca, "wrong_ca")).await;
    let issued_by = format!(
        "the server's certificate does not verify: issued by CN=Sluice test ca, not by a \
         CA of sslrootcert ({other_ca})"
    );
    assert!(
        err.contains(&format!("sslmode=verify-full sslrootcert={other_ca}"))
            && err.contains(&issued_by),
        "{err}"
    );
    // verify-ca, which checks the chain and not the name, names the issuer too.
    let chain_only = format!("sslmode=verify-ca&sslrootcert={other_ca}");
    let err = permanent(source(&pg, "127.0.0.1", &chain_only, "wrong_ca_chain")).await;
    assert!(
        err.contains(&format!("sslmode=verify-ca sslrootcert={other_ca}"))
            && err.contains(&issued_by),
        "{err}"
    );

    let right_ca = format!("sslmode=verify-full&sslrootcert={}", file(&pg, "ca.crt"));
    let err = permanent(source(&pg, "127.0.0.1", &right_ca, "wrong_name")).await;
    assert!(
        err.contains("the server's certificate does not verify: certificate not valid for name"),
        "{err}"
    );
}

#[tokio::test]
async fn plain_text_is_refused_by_a_server_that_takes_tls_only() {
    let (pg, _client) = cluster().await;
    let mut cdc = source(&pg, "127.0.0.1", "sslmode=disable", "plain");
    let mut out = Records::default();
    let err = cdc.queue(records(100), &mut out).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("no pg_hba.conf entry") && message.contains("no encryption"),
        "{message}"
    );
    // The weak modes find TLS: prefer at once, allow after the plain refusal.
    for (weak, slot) in [("sslmode=prefer", "prefer"), ("sslmode=allow", "allow")] {
        let mut cdc = source(&pg, "127.0.0.1", weak, slot);
        assert_eq!(read(&mut cdc, 3).await.len(), 3, "{weak}");
    }
}
