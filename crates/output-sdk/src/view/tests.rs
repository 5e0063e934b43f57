//! The view's promises, the same for both stores: each scenario runs on a local view
//! (a temporary folder) and on a shared one (a schema of its own on the PostgreSQL test
//! server, `SLUICE_TEST_POSTGRES_URL`, dropped at the end).

use super::*;
use sluice_pg_client::tokio_postgres::{self, NoTls};
use sluice_testkit::conformance::{run_detached, server_url, unique_name};

const ALL: (u32, u32) = (0, u32::MAX);

fn test_server() -> String {
    server_url(
        "SLUICE_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// A schema of the test's own, dropped (with the view's tables) at the end.
struct TestSchema {
    name: String,
}

impl TestSchema {
    fn new() -> TestSchema {
        TestSchema {
            name: unique_name(),
        }
    }

    fn place(&self) -> Place {
        let config = json_config(&test_server(), &self.name);
        Place::Shared(EndpointConfig::parse(&config).expect("a valid view"))
    }

    async fn client() -> tokio_postgres::Client {
        let (client, connection) = (tokio_postgres::connect(&test_server(), NoTls).await)
            .expect("connecting to the test server");
        tokio::spawn(connection);
        client
    }
}

fn json_config(url: &str, schema: &str) -> String {
    serde_json::json!({"url": url, "schema": schema}).to_string()
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
        run_detached(async move {
            if let Err(err) = TestSchema::client().await.batch_execute(&drop).await {
                eprintln!("{drop}: {err}");
            }
        });
    }
}

/// Each store, with `run` given its place: the local one, then the shared one.
async fn on_both<F: Future<Output = ()>>(run: impl Fn(Place) -> F) {
    let dir = tempfile::tempdir().unwrap();
    run(Place::Local(dir.path().to_path_buf())).await;
    let schema = TestSchema::new();
    run(schema.place()).await;
}

fn doc(text: &str) -> Option<String> {
    Some(text.to_owned())
}

#[tokio::test]
async fn a_commit_is_whole_and_fenced() {
    on_both(|place| async move {
        let mut view = View::open(&place, "m").await.unwrap();
        assert_eq!(view.claim(ALL.0, ALL.1).await.unwrap(), (1, Vec::new()));
        view.begin().await.unwrap();
        view.write("b", vec![(b"k1".to_vec(), doc("{\"a\":1}"))])
            .await
            .unwrap();
        let keys = vec![b"k0".to_vec(), b"k1".to_vec()];
        assert_eq!(
            view.get_many("b", keys.clone()).await.unwrap(),
            vec![None, doc("{\"a\":1}")],
            "the transaction reads its own writes, in the keys' order"
        );
        view.rollback().await;
        assert_eq!(
            view.get_many("b", keys.clone()).await.unwrap(),
            vec![None, None]
        );

        let writes = vec![
            (b"k2".to_vec(), doc("{\"a\":2}")),
            (b"k1".to_vec(), doc("{\"a\": 1.0}")),
            (b"k3".to_vec(), doc("{}")),
        ];
        view.write("b", writes).await.unwrap();
        view.write("b", vec![(b"k3".to_vec(), None)]).await.unwrap();
        let committed = view.commit((ALL.0, ALL.1, 1), b"cp1".to_vec(), vec![("b".into(), 3)]);
        assert_eq!(committed.await.unwrap(), Some(1));
        assert!(view.snapshot_sent("b").await.unwrap());
        assert!(!view.snapshot_sent("c").await.unwrap());
        let scanned = view.scan("b", None, 10).await.unwrap();
        let expected = vec![
            (b"k1".to_vec(), "{\"a\": 1.0}".to_owned()),
            (b"k2".to_vec(), "{\"a\":2}".to_owned()),
        ];
        assert_eq!(scanned, expected, "in key order, each document as stored");
        assert_eq!(
            view.scan("b", Some(b"k1".to_vec()), 10).await.unwrap()[..],
            expected[1..]
        );

        // A newer instance (another member) claims the range: the older one's commit
        // is refused, and nothing of its transaction is seen.
        let mut newer = View::open(&place, "m").await.unwrap();
        assert_eq!(newer.generation(), view.generation());
        assert_eq!(
            newer.claim(ALL.0, ALL.1).await.unwrap(),
            (2, b"cp1".to_vec())
        );
        view.write("b", vec![(b"k9".to_vec(), doc("{}"))])
            .await
            .unwrap();
        let refused = view.commit((ALL.0, ALL.1, 1), b"cp2".to_vec(), Vec::new());
        assert_eq!(refused.await.unwrap(), Some(2), "reports the current fence");
        assert_eq!(view.fence(ALL.0, ALL.1).await.unwrap(), Some(2));
        assert_eq!(
            newer.get_many("b", vec![b"k9".to_vec()]).await.unwrap(),
            vec![None]
        );
        assert_eq!(newer.scan("b", None, 10).await.unwrap(), expected);
        assert!(newer.is_empty("c").await.unwrap());
        assert_eq!(newer.seed("c", "b").await.unwrap(), 2);
        assert_eq!(newer.scan("c", None, 10).await.unwrap(), expected);
    })
    .await;
}

#[tokio::test]
async fn a_reset_removes_the_view_whole_and_the_next_open_mints_a_new_generation() {
    on_both(|place| async move {
        let mut view = View::open(&place, "m").await.unwrap();
        let first = view.generation();
        assert!(
            !first.adopts_unstamped,
            "a new view owns only what it stamps"
        );
        view.claim(ALL.0, ALL.1).await.unwrap();
        view.write("b", vec![(b"k1".to_vec(), doc("{}"))])
            .await
            .unwrap();
        let committed = view.commit((ALL.0, ALL.1, 1), b"cp1".to_vec(), vec![("b".into(), 1)]);
        assert_eq!(committed.await.unwrap(), Some(1));
        drop(view);
        let again = View::open(&place, "m").await.unwrap();
        assert_eq!(again.generation(), first, "kept while the view lives");
        drop(again);

        let removed = remove(&place, "m")
            .await
            .unwrap()
            .expect("a view to remove");
        assert!(removed.contains(&first.id.to_string()), "{removed}");
        assert_eq!(remove(&place, "m").await.unwrap(), None, "nothing left");
        let mut fresh = View::open(&place, "m").await.unwrap();
        assert_ne!(
            fresh.generation().id,
            first.id,
            "a reset starts a new generation"
        );
        assert!(!fresh.generation().adopts_unstamped);
        let claimed = fresh.claim(ALL.0, ALL.1).await.unwrap();
        assert_eq!(claimed, (1, Vec::new()), "no checkpoint survives");
        let found = fresh.get_many("b", vec![b"k1".to_vec()]).await.unwrap();
        assert_eq!(found, vec![None], "no document survives");
        assert!(
            !fresh.snapshot_sent("b").await.unwrap(),
            "no snapshot survives"
        );
    })
    .await;
}

#[tokio::test]
async fn a_reset_of_a_shared_view_leaves_the_other_materializations_alone() {
    let schema = TestSchema::new();
    let place = schema.place();
    let mut views = Vec::new();
    for m in ["m1", "m2"] {
        let mut view = View::open(&place, m).await.unwrap();
        view.claim(ALL.0, ALL.1).await.unwrap();
        view.write("b", vec![(m.as_bytes().to_vec(), doc("{}"))])
            .await
            .unwrap();
        let committed = view.commit(
            (ALL.0, ALL.1, 1),
            m.as_bytes().to_vec(),
            vec![("b".into(), 1)],
        );
        assert_eq!(committed.await.unwrap(), Some(1));
        views.push(view);
    }
    assert_ne!(
        views[0].generation(),
        views[1].generation(),
        "one per materialization"
    );
    let removed = remove(&place, "m1").await.unwrap().expect("m1's view");
    assert!(
        removed.starts_with("1 documents, 1 key ranges (checkpoint and fence), 1 snapshots sent"),
        "{removed}"
    );

    let kept = views[1].generation();
    let mut m2 = View::open(&place, "m2").await.unwrap();
    assert_eq!(m2.generation(), kept);
    assert_eq!(m2.claim(ALL.0, ALL.1).await.unwrap(), (2, b"m2".to_vec()));
    assert_eq!(
        m2.get_many("b", vec![b"m2".to_vec()]).await.unwrap(),
        vec![doc("{}")]
    );
    assert!(m2.snapshot_sent("b").await.unwrap());

    // m1's instance from before the reset: a new instance claims fence 1 again, in a
    // new generation, and the old one's commit is still refused.
    let mut m1 = View::open(&place, "m1").await.unwrap();
    assert_eq!(m1.claim(ALL.0, ALL.1).await.unwrap(), (1, Vec::new()));
    let old = &mut views[0];
    old.write("b", vec![(b"late".to_vec(), doc("{}"))])
        .await
        .unwrap();
    let refused = old.commit((ALL.0, ALL.1, 1), b"late".to_vec(), Vec::new());
    assert_eq!(refused.await.unwrap(), None, "not this generation's range");
    assert_eq!(old.fence(ALL.0, ALL.1).await.unwrap(), None);
    assert_eq!(
        m1.get_many("b", vec![b"late".to_vec()]).await.unwrap(),
        vec![None]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn members_opening_a_new_shared_view_at_once_create_it_once_with_one_generation() {
    let schema = TestSchema::new();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let place = schema.place();
            tokio::spawn(async move { View::open(&place, "m").await.map(|v| v.generation()) })
        })
        .collect();
    let mut generations = Vec::new();
    for open in opens {
        generations.push(open.await.unwrap().expect("every member opens"));
    }
    assert!(
        generations.windows(2).all(|w| w[0] == w[1]),
        "{generations:?}"
    );
}
