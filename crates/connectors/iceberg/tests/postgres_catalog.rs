//! The catalog on PostgreSQL (`catalog: postgres://…`): the same tables, the same
//! compare-and-swap, and the sink's lifecycle over it. Each test has a schema of its own
//! (the connection's `search_path`), dropped at its end.
//!
//! The server is `SLUICE_TEST_POSTGRES_URL`, by default
//! `postgres://postgres@127.0.0.1:5432/test` (started by `.ci/services`).

mod common;

use common::{Fixture, binding, context, epoch};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation};
use serde_json::json;
use sluice_iceberg::{CatalogLocation, IcebergSink, SqlCatalog};
use sluice_sink_sdk::{Decided, EpochSink, Recovery};

fn server_url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema of this test's own; the catalog's URL points its `search_path` there.
struct TestSchema {
    name: String,
    url: String,
}

impl TestSchema {
    async fn new(test: &str) -> TestSchema {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("iceberg_{test}_{}_{nanos}", std::process::id());
        let client = client().await;
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .unwrap();
        let sep = if server_url().contains('?') { '&' } else { '?' };
        let url = format!("{}{sep}options=-c%20search_path%3D{name}", server_url());
        TestSchema { name, url }
    }

    async fn drop(self) {
        client()
            .await
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await
            .unwrap();
    }
}

async fn client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server_url(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the PostgreSQL test server at {} is needed: {e}",
                server_url()
            )
        });
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_postgres_catalog_creates_loads_and_refuses_a_stale_swap() {
    let schema = TestSchema::new("cas").await;
    let dir = tempfile::tempdir().unwrap();
    let c = SqlCatalog::connect(&CatalogLocation::Postgres(schema.url.clone()), dir.path())
        .await
        .unwrap();
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, Default::default()).await.unwrap();
    assert_eq!(
        c.create_namespace(&ns, Default::default())
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NamespaceAlreadyExists
    );
    let creation = TableCreation::builder()
        .name("t".into())
        .schema(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                ])
                .build()
                .unwrap(),
        )
        .build();
    let t0 = c.create_table(&ns, creation).await.unwrap();
    let stale = t0.metadata_location().unwrap().to_string();
    let tx = Transaction::new(&t0);
    let tx = tx
        .update_table_properties()
        .set("a".into(), "1".into())
        .apply(tx)
        .unwrap();
    let t1 = tx.commit(&c).await.unwrap();

    // A second connection sees the swap.
    let other = SqlCatalog::connect(&CatalogLocation::Postgres(schema.url.clone()), dir.path())
        .await
        .unwrap();
    let loaded = other.load_table(t1.identifier()).await.unwrap();
    assert_eq!(loaded.metadata_location(), t1.metadata_location());

    let tx = Transaction::new(&t1);
    let tx = tx
        .update_table_properties()
        .set("b".into(), "2".into())
        .apply(tx)
        .unwrap();
    let err = tx.commit(&other.pinned(&stale)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CatalogCommitConflicts);
    let row = client()
        .await
        .query_one(
            &format!(
                "SELECT metadata_location, previous_metadata_location FROM {}.iceberg_tables",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, Option<String>>(0).as_deref(),
        t1.metadata_location()
    );
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some(stale.as_str())
    );
    schema.drop().await;
}

#[tokio::test]
async fn the_sink_commits_and_recovers_exactly_once_over_a_postgres_catalog() {
    let schema = TestSchema::new("sink").await;
    let f = Fixture::new();
    let endpoint = json!({"catalog": schema.url, "warehouse": f.warehouse()});
    let bindings = [binding("events")];
    let open = || async {
        let mut sink = IcebergSink::new(&endpoint).unwrap();
        sink.bind_runtime_context(context()).unwrap();
        let plan = sink.resolve_schema(&bindings).await.unwrap();
        sink.prepare_schema(&plan).await.unwrap();
        sink.open(&bindings).await.unwrap();
        sink
    };
    let mut sink = open().await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let d2 = epoch(&mut sink, 2, &[(2, None, "D")]).await.unwrap();
    drop(sink);

    let mut sink = open().await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 2,
            descriptor: d2,
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    let catalog = SqlCatalog::connect(
        &CatalogLocation::Postgres(schema.url.clone()),
        &f.warehouse(),
    )
    .await
    .unwrap();
    let mut rows: Vec<(i64, i64, String)> = sluice_iceberg::read_rows(&catalog, "sluice", "events")
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["_txn"].as_i64().unwrap(),
                r["_op"].as_str().unwrap().into(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(rows, vec![(1, 1, "U".into()), (2, 2, "D".into())]);
    assert_eq!(
        sluice_iceberg::orphan_files(&catalog).await.unwrap(),
        Vec::<String>::new()
    );
    schema.drop().await;
}
