//! The shared view: each binding's view, the runtime checkpoint, the range's fence and
//! the generation of output materializations, in four tables of one PostgreSQL schema
//! (the endpoint's `view: {url, schema}`), which every member of a cluster reaches: an
//! output's shard can move to another member, and the move fences the former holder.
//!
//! ```text
//!  sluice_output_docs(materialization, binding, key bytea, doc text)      the view
//!  sluice_output_ranges(materialization, key_begin, key_end, fence, checkpoint bytea)
//!  sluice_output_snapshots(materialization, binding, txn)                 snapshots sent
//!  sluice_output_meta(materialization, name, value)                       'generation'
//! ```
//!
//! How it keeps the promises of [`super`]:
//! - Open creates the schema and tables if missing, in one transaction under an
//!   advisory lock of the schema: two members' concurrent `CREATE ... IF NOT EXISTS`
//!   can otherwise fail on each other's catalog rows (a unique violation).
//! - The generation is minted by the first open of a materialization (an insert that
//!   does nothing if another open minted first) and kept until a reset deletes it.
//! - A claim is one upsert of the range's row, `fence = fence + 1`, returning the
//!   checkpoint: an upsert that waited for a commit holding the row (READ COMMITTED)
//!   acts on, and returns, the row that commit left.
//! - A transaction's writes run in one PostgreSQL transaction on the instance's own
//!   connection, begun by the first Store and ended by Commit, which locks the range's
//!   row (`FOR UPDATE`) and commits only if the row still holds the claimed fence and
//!   the materialization still has this view's generation; otherwise it rolls back.
//!   The generation check is what keeps an instance opened before a reset (whose claim
//!   may be fence 1 again after the reset) out of the next generation's view.
//! - What crosses the network is batched: one statement per Load message, per run of a
//!   Store's "before" documents (`key = ANY`), per run's upserts (`unnest`) and per
//!   run's removals (the last two pipelined); the hot statements are prepared once per
//!   connection.
//! - Documents are `text`, not `jsonb`: a change's before-image is the document stored,
//!   byte for byte (jsonb would reorder its properties).

use super::Write;
use crate::generation::{Generation, GenerationId};
use sluice_driver_sdk::{Error, Result};
use sluice_pg_client::tokio_postgres::{self, Client, Statement};
use sluice_pg_client::{EndpointConfig, connect, pg_error, quote_ident};
use std::collections::HashMap;

/// How long the server keeps a session idle inside a transaction before ending it (and
/// the transaction with it). Longer than any pause of a live instance inside its
/// transaction (a push or `batch_end`, each bounded by its endpoint's own timeouts, of
/// seconds to a minute); short enough that a former holder frozen mid-transaction (a
/// stopped process, a partitioned machine) releases the rows it locked, which the new
/// holder's writes of the same keys wait for, in minutes rather than at the server's
/// TCP keepalive (hours by default). A live instance that outlasts it fails its commit
/// (retryable) and replays the transaction.
const IDLE_IN_TRANSACTION: &str = "300s";

/// The tables of a schema holding output views.
const TABLES: [&str; 4] = [
    "sluice_output_docs",
    "sluice_output_ranges",
    "sluice_output_snapshots",
    "sluice_output_meta",
];

/// The qualified names of one schema's tables (in [`TABLES`]' order).
struct Tables {
    docs: String,
    ranges: String,
    snapshots: String,
    meta: String,
}

impl Tables {
    fn of(schema: &str) -> Tables {
        let [docs, ranges, snapshots, meta] =
            TABLES.map(|t| format!("{}.{t}", quote_ident(schema)));
        Tables {
            docs,
            ranges,
            snapshots,
            meta,
        }
    }

    /// The statements creating what is missing of the schema and its tables.
    fn create(&self, schema: &str) -> String {
        let Tables {
            docs,
            ranges,
            snapshots,
            meta,
        } = self;
        format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {docs} (
                 materialization text NOT NULL, binding text NOT NULL,
                 key bytea NOT NULL, doc text NOT NULL,
                 PRIMARY KEY (materialization, binding, key));
             CREATE TABLE IF NOT EXISTS {ranges} (
                 materialization text NOT NULL, key_begin bigint NOT NULL,
                 key_end bigint NOT NULL, fence bigint NOT NULL, checkpoint bytea NOT NULL,
                 PRIMARY KEY (materialization, key_begin, key_end));
             CREATE TABLE IF NOT EXISTS {snapshots} (
                 materialization text NOT NULL, binding text NOT NULL, txn bigint NOT NULL,
                 PRIMARY KEY (materialization, binding));
             CREATE TABLE IF NOT EXISTS {meta} (
                 materialization text NOT NULL, name text NOT NULL, value text NOT NULL,
                 PRIMARY KEY (materialization, name));",
            schema = quote_ident(schema)
        )
    }

    /// The range's fence, if the materialization still has generation `$4`.
    fn fence(&self) -> String {
        format!(
            "SELECT r.fence FROM {} r
             WHERE r.materialization = $1 AND r.key_begin = $2 AND r.key_end = $3
               AND EXISTS (SELECT FROM {} g WHERE g.materialization = $1
                           AND g.name = 'generation' AND g.value = $4)",
            self.ranges, self.meta
        )
    }
}

/// Materialization `materialization`'s view in `config`'s schema, for messages.
pub fn describe(config: &EndpointConfig, materialization: &str) -> String {
    format!(
        "the output view of {materialization:?} in {} schema {:?}",
        config.describe(),
        config.schema()
    )
}

/// The error of a failed call, naming the view and what it was doing.
fn failed(place: &str, doing: &str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    let context = format!("{place}: {doing}");
    move |err| pg_error(context, err)
}

/// Creates the schema and the tables if any is missing.
async fn ensure_tables(
    client: &mut Client,
    schema: &str,
    tables: &Tables,
    place: &str,
) -> Result<()> {
    if count_tables(client, schema, place).await? == TABLES.len() {
        return Ok(());
    }
    let tx = (client.transaction().await).map_err(failed(place, "creating its tables"))?;
    // Held until the transaction ends: members creating the tables at once take turns.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('sluice_output_view'), hashtext($1))",
        &[&schema],
    )
    .await
    .map_err(failed(place, "locking its schema to create its tables"))?;
    tx.batch_execute(&tables.create(schema))
        .await
        .map_err(failed(place, "creating its tables"))?;
    tx.commit()
        .await
        .map_err(failed(place, "creating its tables"))
}

/// How many of [`TABLES`] exist in `schema`.
async fn count_tables(client: &Client, schema: &str, place: &str) -> Result<usize> {
    let names = TABLES.to_vec();
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = ANY($2)",
            &[&schema, &names],
        )
        .await
        .map_err(failed(place, "looking up its tables"))?;
    Ok(row.get::<_, i64>(0) as usize)
}

/// The materialization's generation, minted if it has none.
async fn generation(
    client: &Client,
    tables: &Tables,
    materialization: &str,
    place: &str,
) -> Result<Generation> {
    let mint = format!(
        "WITH minted AS (
             INSERT INTO {meta} (materialization, name, value) VALUES ($1, 'generation', $2)
             ON CONFLICT DO NOTHING RETURNING value)
         SELECT value, true FROM minted
         UNION ALL SELECT value, false FROM {meta} WHERE materialization = $1 AND name = 'generation'",
        meta = tables.meta
    );
    // A generation minted by another open while this statement ran is seen by neither
    // of its parts (the insert waited for it, the select's snapshot predates it): a
    // second try reads it.
    for _ in 0..3 {
        let id = GenerationId::mint().to_string();
        let rows = (client.query(&mint, &[&materialization, &id]).await)
            .map_err(failed(place, "minting its generation"))?;
        let Some(row) = rows.first() else { continue };
        let id = GenerationId::parse(row.get(0))
            .map_err(|e| Error::store(place, format!("its generation: {e}"), false))?;
        if row.get::<_, bool>(1) {
            tracing::info!(generation = %id, view = place, "a new output view: its generation");
        }
        return Ok(Generation {
            id,
            // The shared view is newer than generations: nothing it wrote is unstamped.
            adopts_unstamped: false,
        });
    }
    Err(Error::store(
        place,
        "its generation was minted and removed again while it opened (a reset at the same \
         time?)",
        true,
    ))
}

/// The statements of the hot path, prepared once per connection.
struct Statements {
    get_many: Statement,
    upsert: Statement,
    delete: Statement,
    scan: Statement,
}

impl Statements {
    async fn prepare(
        client: &Client,
        tables: &Tables,
    ) -> Result<Statements, tokio_postgres::Error> {
        let docs = &tables.docs;
        let [get_many, upsert, delete, scan] = [
            format!(
                "SELECT key, doc FROM {docs}
                 WHERE materialization = $1 AND binding = $2 AND key = ANY($3)"
            ),
            format!(
                "INSERT INTO {docs} (materialization, binding, key, doc)
                 SELECT $1, $2, k, d FROM unnest($3::bytea[], $4::text[]) AS u(k, d)
                 ON CONFLICT (materialization, binding, key) DO UPDATE SET doc = excluded.doc"
            ),
            format!(
                "DELETE FROM {docs}
                 WHERE materialization = $1 AND binding = $2 AND key = ANY($3)"
            ),
            format!(
                "SELECT key, doc FROM {docs}
                 WHERE materialization = $1 AND binding = $2 AND key > $3
                 ORDER BY key LIMIT $4"
            ),
        ];
        let (get_many, upsert, delete, scan) = tokio::try_join!(
            client.prepare(&get_many),
            client.prepare(&upsert),
            client.prepare(&delete),
            client.prepare(&scan),
        )?;
        Ok(Statements {
            get_many,
            upsert,
            delete,
            scan,
        })
    }
}

/// One instance's connection to its materialization's shared view.
pub(crate) struct SharedView {
    client: Client,
    materialization: String,
    generation: Generation,
    tables: Tables,
    statements: Statements,
    /// The view, for errors ([`describe`]).
    place: String,
    /// A transaction is open on the connection (`BEGIN` sent).
    in_transaction: bool,
}

impl SharedView {
    /// Connects, creating the tables if missing and minting the generation if none.
    pub async fn open(config: &EndpointConfig, materialization: &str) -> Result<SharedView> {
        let place = describe(config, materialization);
        let mut client = connect(config).await?;
        let session = format!("SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'");
        (client.batch_execute(&session).await).map_err(failed(&place, "setting its session"))?;
        let tables = Tables::of(config.schema());
        ensure_tables(&mut client, config.schema(), &tables, &place).await?;
        let generation = generation(&client, &tables, materialization, &place).await?;
        let statements = (Statements::prepare(&client, &tables).await)
            .map_err(failed(&place, "preparing its statements"))?;
        Ok(SharedView {
            client,
            materialization: materialization.to_owned(),
            generation,
            tables,
            statements,
            place,
            in_transaction: false,
        })
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    pub async fn claim(&mut self, key_begin: u32, key_end: u32) -> Result<(i64, Vec<u8>)> {
        let claim = format!(
            "INSERT INTO {} AS r (materialization, key_begin, key_end, fence, checkpoint)
             VALUES ($1, $2, $3, 1, ''::bytea)
             ON CONFLICT (materialization, key_begin, key_end) DO UPDATE SET fence = r.fence + 1
             RETURNING fence, checkpoint",
            self.tables.ranges
        );
        let (begin, end) = (i64::from(key_begin), i64::from(key_end));
        let row = (self.client)
            .query_one(&claim, &[&self.materialization, &begin, &end])
            .await
            .map_err(failed(&self.place, "raising the range's fence"))?;
        Ok((row.get(0), row.get(1)))
    }

    pub async fn fence(&mut self, key_begin: u32, key_end: u32) -> Result<Option<i64>> {
        self.read_fence(key_begin, key_end, "").await
    }

    /// The range's fence in this generation; `lock`: appended (`FOR UPDATE OF r`).
    async fn read_fence(&self, key_begin: u32, key_end: u32, lock: &str) -> Result<Option<i64>> {
        let sql = format!("{} {lock}", self.tables.fence());
        let (begin, end) = (i64::from(key_begin), i64::from(key_end));
        let generation = self.generation.id.to_string();
        let row = (self.client)
            .query_opt(&sql, &[&self.materialization, &begin, &end, &generation])
            .await
            .map_err(failed(&self.place, "reading the range's fence"))?;
        Ok(row.map(|row| row.get(0)))
    }

    pub async fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            (self.client.batch_execute("BEGIN").await)
                .map_err(failed(&self.place, "beginning a transaction"))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    pub async fn get_many(
        &mut self,
        binding: &str,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<String>>> {
        let rows = (self.client)
            .query(
                &self.statements.get_many,
                &[&self.materialization, &binding, &keys],
            )
            .await
            .map_err(failed(&self.place, "looking up keys"))?;
        let mut found: HashMap<Vec<u8>, String> = rows
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        Ok(keys.iter().map(|key| found.remove(key)).collect())
    }

    pub async fn write(&mut self, binding: &str, writes: &[Write]) -> Result<()> {
        self.begin().await?;
        let (mut keys, mut docs, mut removed) = (Vec::new(), Vec::new(), Vec::new());
        for (key, doc) in writes {
            match doc {
                Some(doc) => {
                    keys.push(key.as_slice());
                    docs.push(doc.as_str());
                }
                None => removed.push(key.as_slice()),
            }
        }
        let (client, statements, m) = (&self.client, &self.statements, &self.materialization);
        let upsert = async {
            match keys.is_empty() {
                true => Ok(0),
                false => (client.execute(&statements.upsert, &[m, &binding, &keys, &docs])).await,
            }
        };
        let delete = async {
            match removed.is_empty() {
                true => Ok(0),
                false => (client.execute(&statements.delete, &[m, &binding, &removed])).await,
            }
        };
        tokio::try_join!(upsert, delete).map_err(failed(&self.place, "writing the view"))?;
        Ok(())
    }

    pub async fn scan(
        &mut self,
        binding: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, String)>> {
        let (after, limit) = (after.unwrap_or_default(), limit as i64);
        let rows = (self.client)
            .query(
                &self.statements.scan,
                &[&self.materialization, &binding, &after, &limit],
            )
            .await
            .map_err(failed(&self.place, "scanning the view"))?;
        Ok(rows
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect())
    }

    pub async fn snapshot_sent(&mut self, binding: &str) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS (SELECT FROM {} WHERE materialization = $1 AND binding = $2)",
            self.tables.snapshots
        );
        let row = (self.client)
            .query_one(&sql, &[&self.materialization, &binding])
            .await
            .map_err(failed(&self.place, "reading the snapshots sent"))?;
        Ok(row.get(0))
    }

    pub async fn seed(&mut self, binding: &str, from: &str) -> Result<u64> {
        let sql = format!(
            "INSERT INTO {docs} (materialization, binding, key, doc)
             SELECT materialization, $2, key, doc FROM {docs}
             WHERE materialization = $1 AND binding = $3",
            docs = self.tables.docs
        );
        (self.client)
            .execute(&sql, &[&self.materialization, &binding, &from])
            .await
            .map_err(failed(&self.place, "seeding a binding's view"))
    }

    pub async fn commit(
        &mut self,
        (key_begin, key_end, fence): (u32, u32, i64),
        checkpoint: &[u8],
        snapshots: &[(String, u64)],
    ) -> Result<Option<i64>> {
        self.begin().await?;
        let current = match self.read_fence(key_begin, key_end, "FOR UPDATE OF r").await {
            Ok(current) if current == Some(fence) => current,
            Ok(current) => {
                self.rollback().await?;
                return Ok(current);
            }
            Err(err) => {
                self.abandon().await;
                return Err(err);
            }
        };
        let written = self
            .commit_locked(key_begin, key_end, checkpoint, snapshots)
            .await;
        match written {
            Ok(()) => {
                self.in_transaction = false;
                Ok(current)
            }
            Err(err) => {
                self.abandon().await;
                Err(err)
            }
        }
    }

    /// The checkpoint and the snapshots sent, then `COMMIT`: the range's row is locked.
    async fn commit_locked(
        &mut self,
        key_begin: u32,
        key_end: u32,
        checkpoint: &[u8],
        snapshots: &[(String, u64)],
    ) -> Result<()> {
        let (begin, end) = (i64::from(key_begin), i64::from(key_end));
        let set_checkpoint = format!(
            "UPDATE {} SET checkpoint = $4
             WHERE materialization = $1 AND key_begin = $2 AND key_end = $3",
            self.tables.ranges
        );
        (self.client)
            .execute(
                &set_checkpoint,
                &[&self.materialization, &begin, &end, &checkpoint],
            )
            .await
            .map_err(failed(&self.place, "writing the checkpoint"))?;
        if !snapshots.is_empty() {
            let sent = format!(
                "INSERT INTO {} (materialization, binding, txn)
                 SELECT $1, b, t FROM unnest($2::text[], $3::bigint[]) AS u(b, t)
                 ON CONFLICT (materialization, binding) DO UPDATE SET txn = excluded.txn",
                self.tables.snapshots
            );
            let bindings: Vec<&str> = snapshots.iter().map(|(b, _)| b.as_str()).collect();
            let txns: Vec<i64> = snapshots.iter().map(|(_, t)| *t as i64).collect();
            (self.client)
                .execute(&sent, &[&self.materialization, &bindings, &txns])
                .await
                .map_err(failed(&self.place, "writing the snapshots sent"))?;
        }
        (self.client.batch_execute("COMMIT").await).map_err(failed(&self.place, "committing"))
    }

    pub async fn rollback(&mut self) -> Result<()> {
        if std::mem::take(&mut self.in_transaction) {
            (self.client.batch_execute("ROLLBACK").await)
                .map_err(failed(&self.place, "rolling back"))?;
        }
        Ok(())
    }

    /// Rolls back after a failure, which is what is reported: a failure to roll back
    /// (the connection is gone, and the transaction with it) is only logged.
    async fn abandon(&mut self) {
        if let Err(err) = self.rollback().await {
            tracing::warn!(%err, "rolling back the output view's failed transaction");
        }
    }
}

/// Removes materialization `materialization`'s rows of all four tables in one
/// transaction; says what it removed (`None`: nothing).
pub async fn remove(config: &EndpointConfig, materialization: &str) -> Result<Option<String>> {
    let place = describe(config, materialization);
    let mut client = connect(config).await?;
    if count_tables(&client, config.schema(), &place).await? == 0 {
        return Ok(None);
    }
    let tables = Tables::of(config.schema());
    ensure_tables(&mut client, config.schema(), &tables, &place).await?;
    let tx = (client.transaction().await).map_err(failed(&place, "beginning the reset"))?;
    let m: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&materialization];
    let generation = tx
        .query_opt(
            &format!(
                "DELETE FROM {} WHERE materialization = $1 AND name = 'generation' RETURNING value",
                tables.meta
            ),
            &m,
        )
        .await
        .map_err(failed(&place, "removing its generation"))?
        .map(|row| row.get::<_, String>(0));
    let mut removed = [0; 3];
    for (count, table) in removed
        .iter_mut()
        .zip([&tables.ranges, &tables.snapshots, &tables.docs])
    {
        *count = (tx.execute(
            &format!("DELETE FROM {table} WHERE materialization = $1"),
            &m,
        ))
        .await
        .map_err(failed(&place, &format!("removing its rows of {table}")))?;
    }
    tx.execute(
        &format!("DELETE FROM {} WHERE materialization = $1", tables.meta),
        &m,
    )
    .await
    .map_err(failed(&place, "removing its other metadata"))?;
    tx.commit()
        .await
        .map_err(failed(&place, "committing the reset"))?;
    let [ranges, snapshots, documents] = removed;
    if generation.is_none() && removed == [0; 3] {
        return Ok(None);
    }
    Ok(Some(format!(
        "{documents} documents, {ranges} key ranges (checkpoint and fence), {snapshots} \
         snapshots sent; generation {} ended",
        generation.as_deref().unwrap_or("(none)")
    )))
}
