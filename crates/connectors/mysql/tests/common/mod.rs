//! Fixtures shared by the MariaDB driver's tests: a database of its own per test
//! ([`TestDb`], dropped at the end even if the test fails), a `pageviews` collection
//! with one projection of each column type, materialization specs over it, builders of
//! Load and Store messages, and a runtime-side [`Session`] through the in-process
//! endpoint.
//!
//! The server is `SLUICE_TEST_MYSQL_URL`, by default `mysql://root@127.0.0.1:3306/test`
//! (started by `.ci/services`); each test's database is created on it.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_doc::tuple;
use sluice_driver::Driver;
use sluice_mysql::MysqlDriver;
use sluice_proto::flow::{self, Slice};
use sluice_proto::materialize::transaction_request::{Load, Open, Store};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const MATERIALIZATION: &str = "acme/views-db";
pub const ALL: u32 = u32::MAX;

fn server_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A database of this test's own, named `sluice_t_<pid>_<counter>_<nanos>` so parallel
/// tests and reruns never collide. Only the driver under test connects to it by name,
/// so a test can find and kill the driver's connections.
pub struct TestDb {
    pub database: String,
    /// The driver's URL: the server with this database.
    pub url: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let database = format!(
            "sluice_t_{}_{}_{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let server = server_url();
        let base = server
            .rsplit_once('/')
            .map_or(server.as_str(), |(base, _)| base);
        let url = format!("{base}/{database}");
        let db = TestDb { database, url };
        db.execute(&format!("CREATE DATABASE `{}`", db.database))
            .await;
        db
    }

    /// The endpoint configuration of this database.
    pub fn endpoint(&self) -> Value {
        json!({ "url": self.url })
    }

    /// A connection of the test itself, to the server's default database.
    pub async fn conn(&self) -> mysql_async::Conn {
        mysql_async::Conn::from_url(server_url())
            .await
            .expect("connecting to the test server")
    }

    pub async fn execute(&self, sql: &str) {
        let mut conn = self.conn().await;
        conn.query_drop(sql)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
        let _ = conn.disconnect().await;
    }

    /// Rows of `sql` (in this database), each as a JSON value: the query must select
    /// one column of JSON text, e.g. `JSON_ARRAY(...)`.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        let mut conn = self.conn().await;
        conn.query_drop(format!("USE `{}`", self.database))
            .await
            .unwrap();
        let texts: Vec<String> = conn
            .query(sql)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
        let _ = conn.disconnect().await;
        texts
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_else(|err| panic!("{t}: {err}")))
            .collect()
    }

    /// Ends every connection the driver under test holds (a server-side disconnect).
    pub async fn kill_driver_connections(&self) -> usize {
        let mut conn = self.conn().await;
        let ids: Vec<u64> = conn
            .exec(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?",
                (&self.database,),
            )
            .await
            .unwrap();
        for id in &ids {
            let _ = conn.query_drop(format!("KILL {id}")).await;
        }
        ids.len()
    }
}

impl Drop for TestDb {
    /// Drops the database. Runs on a thread of its own: the test's runtime may be the
    /// one calling.
    fn drop(&mut self) {
        let database = self.database.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let Ok(mut conn) = mysql_async::Conn::from_url(server_url()).await else {
                    return;
                };
                let drop = format!("DROP DATABASE IF EXISTS `{database}`");
                if let Err(err) = conn.query_drop(&drop).await {
                    eprintln!("{drop}: {err}");
                }
                let _ = conn.disconnect().await;
            });
        });
        let _ = cleanup.join();
    }
}

fn projection(field: &str, ptr: &str, types: &[&str], key: bool) -> flow::Projection {
    flow::Projection {
        ptr: ptr.to_owned(),
        field: field.to_owned(),
        is_primary_key: key,
        inference: Some(flow::Inference {
            types: types.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `acme/pageviews`, keyed by `/user_id`, with a field of every kind.
pub fn collection() -> flow::CollectionSpec {
    let mut seen_at = projection("seen_at", "/seen_at", &["string"], false);
    if let Some(inference) = seen_at.inference.as_mut() {
        inference.string = Some(flow::inference::String {
            format: "date-time".into(),
            ..Default::default()
        });
    }
    flow::CollectionSpec {
        collection: "acme/pageviews".into(),
        key_ptrs: vec!["/user_id".into()],
        projections: vec![
            projection("user_id", "/user_id", &["string"], true),
            projection("day", "/day", &["integer"], false),
            projection("views", "/views", &["integer"], false),
            projection("score", "/score", &["number", "null"], false),
            projection("active", "/active", &["boolean"], false),
            projection("tags", "/tags", &["array"], false),
            seen_at,
            projection("meta/source", "/meta/source", &["string"], false),
            projection("nothing", "/nothing", &["null"], false),
            projection("flow_document", "", &["object"], false),
        ],
        ..Default::default()
    }
}

/// The value fields selected by [`binding`], in order.
pub const VALUES: [&str; 5] = ["views", "score", "active", "tags", "seen_at"];

pub fn binding(table: &str, delta_updates: bool) -> flow::materialization_spec::Binding {
    binding_keyed(table, delta_updates, &["user_id"])
}

/// [`binding`] of the collection keyed by the given top-level fields instead.
pub fn binding_keyed(
    table: &str,
    delta_updates: bool,
    keys: &[&str],
) -> flow::materialization_spec::Binding {
    let mut collection = collection();
    collection.key_ptrs = keys.iter().map(|k| format!("/{k}")).collect();
    for p in &mut collection.projections {
        p.is_primary_key = keys.contains(&p.field.as_str());
    }
    flow::materialization_spec::Binding {
        resource_spec_json: json!({ "table": table }).to_string(),
        resource_path: vec![table.to_owned()],
        collection: Some(collection),
        field_selection: Some(flow::FieldSelection {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            values: VALUES.iter().map(|v| v.to_string()).collect(),
            document: "flow_document".into(),
            ..Default::default()
        }),
        delta_updates,
    }
}

pub fn spec(
    db: &TestDb,
    bindings: Vec<flow::materialization_spec::Binding>,
) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: MATERIALIZATION.into(),
        endpoint_type: flow::EndpointType::Invalid as i32,
        endpoint_spec_json: db.endpoint().to_string(),
        bindings,
    }
}

pub fn apply_request(
    spec: &flow::MaterializationSpec,
    dry_run: bool,
) -> sluice_proto::materialize::ApplyRequest {
    sluice_proto::materialize::ApplyRequest {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        dry_run,
    }
}

/// Applies `spec`; returns the action description.
pub async fn apply(spec: &flow::MaterializationSpec) -> String {
    MysqlDriver::new()
        .apply_upsert(apply_request(spec, false))
        .await
        .unwrap()
        .action_description
}

pub fn open(spec: &flow::MaterializationSpec, key_begin: u32, key_end: u32) -> Open {
    Open {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        key_begin,
        key_end,
        driver_checkpoint_json: b"{}".to_vec(),
    }
}

/// Appends `bytes` to `arena` and returns their slice.
fn push(arena: &mut Vec<u8>, bytes: &[u8]) -> Slice {
    let begin = arena.len() as u32;
    arena.extend_from_slice(bytes);
    Slice {
        begin,
        end: arena.len() as u32,
    }
}

fn pointer_value(doc: &Value, ptr: &str) -> Value {
    doc.pointer(ptr).cloned().unwrap_or(Value::Null)
}

/// A Load of `keys`, each a JSON array of key components.
pub fn load(binding: u32, keys: &[Value]) -> Load {
    let mut arena = Vec::new();
    let packed_keys = keys
        .iter()
        .map(|key| push(&mut arena, &tuple::pack_key(key.as_array().unwrap())))
        .collect();
    Load {
        binding,
        arena,
        packed_keys,
    }
}

/// A Store of `docs`, each with its `exists` flag; the key (at `key_ptrs`) and the
/// [`VALUES`] are extracted from the documents as the runtime does. A document
/// `{"key": [...]}` stands for a deletion of that key (document `null`).
pub fn store(binding: u32, key_ptrs: &[&str], docs: &[(Value, bool)]) -> Store {
    let value_ptrs: Vec<String> = VALUES.iter().map(|f| format!("/{f}")).collect();
    let value_ptrs: Vec<&str> = value_ptrs.iter().map(String::as_str).collect();
    store_values(binding, key_ptrs, &value_ptrs, docs)
}

/// [`store`] with the values at `value_ptrs` instead of the [`VALUES`] fields.
pub fn store_values(
    binding: u32,
    key_ptrs: &[&str],
    value_ptrs: &[&str],
    docs: &[(Value, bool)],
) -> Store {
    let mut msg = Store {
        binding,
        ..Default::default()
    };
    for (doc, exists) in docs {
        let (key, values, text) = match doc.get("key") {
            Some(Value::Array(key)) => (tuple::pack_key(key), Vec::new(), "null".to_owned()),
            _ => {
                let key: Vec<Value> = key_ptrs.iter().map(|p| pointer_value(doc, p)).collect();
                let values: Vec<Value> = value_ptrs.iter().map(|p| pointer_value(doc, p)).collect();
                (
                    tuple::pack_key(&key),
                    tuple::pack_key(&values),
                    doc.to_string(),
                )
            }
        };
        msg.packed_keys.push(push(&mut msg.arena, &key));
        msg.packed_values.push(push(&mut msg.arena, &values));
        msg.docs_json.push(push(&mut msg.arena, text.as_bytes()));
        msg.exists.push(*exists);
    }
    msg
}

/// A pageview document.
pub fn view(user: &str, views: i64) -> Value {
    json!({
        "user_id": user, "views": views, "score": 1.5, "active": true, "tags": ["a", "b"],
        "seen_at": "2024-05-01T12:00:00Z"
    })
}

/// A runtime's side of one Transactions stream to the MariaDB driver, in process.
pub struct Session {
    tx: sluice_driver::client::ClientSender,
    rx: sluice_driver::client::ClientReceiver,
}

impl Session {
    /// Opens the key range `[key_begin, key_end]`; returns the recovered checkpoint.
    pub async fn open(
        spec: &flow::MaterializationSpec,
        key_begin: u32,
        key_end: u32,
    ) -> sluice_driver::Result<(Session, Vec<u8>)> {
        use sluice_driver::Endpoint;
        let driver = std::sync::Arc::new(MysqlDriver::new());
        let endpoint = sluice_driver::inprocess::InProcess::new("mysql", driver);
        let stream = endpoint.transactions().await?;
        let (tx, rx, opened) =
            sluice_driver::client::open(stream, open(spec, key_begin, key_end)).await?;
        Ok((Session { tx, rx }, opened.flow_checkpoint))
    }

    /// A request that could not be sent because the driver ended the stream fails with
    /// the driver's own error, the next response, rather than "stream closed".
    async fn driver_error(&mut self, sent: sluice_driver::Result<()>) -> sluice_driver::Result<()> {
        match sent {
            Ok(()) => Ok(()),
            Err(closed) => Err(self.rx.recv().await.err().unwrap_or(closed)),
        }
    }

    /// One transaction: acknowledge the prior one, load `loads`, prepare with
    /// `checkpoint`, store `stores`, commit. Returns the loaded documents.
    pub async fn transaction(
        &mut self,
        loads: Vec<Load>,
        checkpoint: &[u8],
        stores: Vec<Store>,
    ) -> sluice_driver::Result<Vec<Value>> {
        use sluice_driver::client::Response;
        use sluice_proto::materialize::transaction_request::Prepare;
        let mut loaded = Vec::new();
        let mut collect = |response: Response| match response {
            Response::Loaded(msg) => {
                for doc in sluice_driver::arena::loaded_docs(&msg) {
                    loaded.push(serde_json::from_slice(doc.unwrap()).unwrap());
                }
                false
            }
            _ => true,
        };
        let sent = self.tx.acknowledge().await;
        self.driver_error(sent).await?;
        for load in loads {
            let sent = self.tx.load(load).await;
            self.driver_error(sent).await?;
        }
        while !collect(self.rx.recv().await?) {}
        let sent = self
            .tx
            .prepare(Prepare {
                flow_checkpoint: checkpoint.to_vec(),
            })
            .await;
        self.driver_error(sent).await?;
        while !collect(self.rx.recv().await?) {}
        for store in stores {
            let sent = self.tx.store(store).await;
            self.driver_error(sent).await?;
        }
        let sent = self.tx.commit().await;
        self.driver_error(sent).await?;
        match self.rx.recv().await? {
            Response::DriverCommitted => Ok(loaded),
            other => panic!("expected DriverCommitted, got {other:?}"),
        }
    }
}
