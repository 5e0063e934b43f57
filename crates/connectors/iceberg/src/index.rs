//! The upsert index: per key of an upsert table, where its live row is (data file and
//! row position) and its document (what Load hands back). One SQLite file in the
//! endpoint's state folder (`<state_dir>/iceberg-index.db`), so memory stays bounded
//! whatever the number of keys.
//!
//! ```text
//!  rows(tbl, key, file, pos, doc)    key: the key columns as a JSON array (`key_texts` of upsert.rs)
//!                                    one row per live key; (tbl, file, pos) indexed too
//!  meta(tbl, uuid, snapshot)         the table (its uuid) and snapshot the rows reflect
//! ```
//!
//! The index is derived state: the table is the truth. It reflects exactly one snapshot
//! of the table, recorded beside the rows in the same SQLite transaction, and
//! `upsert.rs`'s `sync` brings it to the table's current snapshot after every commit
//! and at every start: rolling forward through the snapshots since (their added delete
//! files, then their added data files), or rebuilding it from a scan of the live rows.
//! So a crash anywhere (before the table commit, between it and the index update, in
//! the middle of an update) leaves an index that the next start repairs, and a reset
//! (the table dropped and created again: a new uuid) starts it over.
//!
//! Threads: SQLite is synchronous; every call hops to tokio's blocking pool with the
//! connection behind a mutex. A roll forward is one SQLite transaction, begun by
//! [`Index::begin`] and ended by [`Index::commit`] (WAL, `synchronous=NORMAL`: a torn
//! tail after a power loss is an older state, which `sync` repairs like any other).

use rusqlite::{Connection, OptionalExtension, params};
use sluice_sink_sdk::{Result, SinkError};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The index file in the endpoint's state folder.
pub const INDEX_FILE: &str = "iceberg-index.db";
/// How long a statement waits for another connection's lock: a retired instance's last
/// statement (its future dropped at a deadline, its blocking call still running) ends
/// within one batch, seconds at most.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS rows (
    tbl TEXT NOT NULL, key TEXT NOT NULL, file TEXT NOT NULL, pos INTEGER NOT NULL,
    doc TEXT NOT NULL, PRIMARY KEY (tbl, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rows_at ON rows (tbl, file, pos);
CREATE TABLE IF NOT EXISTS meta (
    tbl TEXT PRIMARY KEY, uuid TEXT NOT NULL, snapshot INTEGER) WITHOUT ROWID;
";

/// Where a key's live row is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowAt {
    pub file: String,
    pub pos: i64,
}

/// The table and snapshot the index reflects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reflects {
    pub uuid: String,
    /// `None`: the table had no snapshot.
    pub snapshot: Option<i64>,
}

/// The index, cheap to clone (one shared connection).
#[derive(Clone)]
pub struct Index {
    conn: Arc<Mutex<Connection>>,
}

fn sql(what: &str) -> impl FnOnce(rusqlite::Error) -> SinkError + '_ {
    move |e| SinkError::External(format!("the upsert index ({what}): {e}"))
}

impl Index {
    /// Opens (creating) the index in `state_dir`.
    pub async fn open(state_dir: &Path) -> Result<Index> {
        let path = state_dir.join(INDEX_FILE);
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            std::fs::create_dir_all(path.parent().expect("a file in a folder")).map_err(|e| {
                SinkError::External(format!("cannot create {}: {e}", path.display()))
            })?;
            let conn = Connection::open(&path).map_err(sql("open"))?;
            // A retired instance's connection may still end its last statement: wait
            // for it rather than fail.
            conn.busy_timeout(BUSY_TIMEOUT).map_err(sql("open"))?;
            conn.execute_batch(SCHEMA).map_err(sql("schema"))?;
            Ok(conn)
        })
        .await
        .map_err(|e| SinkError::External(format!("the upsert index: {e}")))??;
        Ok(Index {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| SinkError::External(format!("the upsert index: {e}")))?
    }

    /// What the index of `tbl` reflects (`None`: nothing yet).
    pub async fn reflects(&self, tbl: &str) -> Result<Option<Reflects>> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            c.query_row(
                "SELECT uuid, snapshot FROM meta WHERE tbl = ?1",
                params![tbl],
                |r| {
                    Ok(Reflects {
                        uuid: r.get(0)?,
                        snapshot: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(sql("meta"))
        })
        .await
    }

    /// Where each of `keys` of `tbl` lives (`None`: no live row).
    pub async fn rows_at(&self, tbl: &str, keys: Vec<String>) -> Result<Vec<Option<RowAt>>> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT file, pos FROM rows WHERE tbl = ?1 AND key = ?2")
                .map_err(sql("lookup"))?;
            keys.iter()
                .map(|k| {
                    stmt.query_row(params![tbl, k], |r| {
                        Ok(RowAt {
                            file: r.get(0)?,
                            pos: r.get(1)?,
                        })
                    })
                    .optional()
                    .map_err(sql("lookup"))
                })
                .collect()
        })
        .await
    }

    /// The documents of those of `keys` that `tbl` holds.
    pub async fn docs(&self, tbl: &str, keys: Vec<String>) -> Result<Vec<String>> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT doc FROM rows WHERE tbl = ?1 AND key = ?2")
                .map_err(sql("load"))?;
            let mut out = Vec::new();
            for k in &keys {
                if let Some(doc) = stmt
                    .query_row(params![tbl, k], |r| r.get::<_, String>(0))
                    .optional()
                    .map_err(sql("load"))?
                {
                    out.push(doc);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Begins an update of `tbl`'s rows (one SQLite transaction, ended by
    /// [`Index::commit`]); with `clear`, from nothing (a rebuild). An update left
    /// unfinished before is rolled back first.
    pub async fn begin(&self, tbl: &str, clear: bool) -> Result<()> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            if !c.is_autocommit() {
                c.execute_batch("ROLLBACK").map_err(sql("rollback"))?;
            }
            c.execute_batch("BEGIN IMMEDIATE").map_err(sql("begin"))?;
            if clear {
                c.execute("DELETE FROM rows WHERE tbl = ?1", params![tbl])
                    .map_err(sql("clear"))?;
                c.execute("DELETE FROM meta WHERE tbl = ?1", params![tbl])
                    .map_err(sql("clear"))?;
            }
            Ok(())
        })
        .await
    }

    /// Removes the rows of `tbl` that live at `at` (position deletes applied).
    pub async fn remove_at(&self, tbl: &str, at: Vec<RowAt>) -> Result<()> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "DELETE FROM rows INDEXED BY rows_at WHERE tbl = ?1 AND file = ?2 AND pos = ?3",
                )
                .map_err(sql("delete"))?;
            for a in &at {
                stmt.execute(params![tbl, a.file, a.pos])
                    .map_err(sql("delete"))?;
            }
            Ok(())
        })
        .await
    }

    /// Adds live rows `(key, at, doc)` of `tbl`. A key that already has a live row is
    /// `Corrupt`: the table would hold two rows of one key.
    pub async fn add(&self, tbl: &str, rows: Vec<(String, RowAt, String)>) -> Result<()> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "INSERT INTO rows (tbl, key, file, pos, doc) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(sql("insert"))?;
            for (key, at, doc) in &rows {
                match stmt.execute(params![tbl, key, at.file, at.pos, doc]) {
                    Ok(_) => {}
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                    {
                        return Err(SinkError::Corrupt(format!(
                            "Iceberg table {tbl} holds two live rows of key {key} (the \
                             second at {} position {}): it was not written by this sink's \
                             upsert mode alone",
                            at.file, at.pos
                        )));
                    }
                    Err(e) => return Err(sql("insert")(e)),
                }
            }
            Ok(())
        })
        .await
    }

    /// Ends the update begun by [`Index::begin`]: the rows now reflect `reflects`.
    /// Returns once SQLite committed.
    pub async fn commit(&self, tbl: &str, reflects: Reflects) -> Result<()> {
        let tbl = tbl.to_string();
        self.with(move |c| {
            c.execute(
                "INSERT INTO meta (tbl, uuid, snapshot) VALUES (?1, ?2, ?3)
                 ON CONFLICT (tbl) DO UPDATE SET uuid = ?2, snapshot = ?3",
                params![tbl, reflects.uuid, reflects.snapshot],
            )
            .map_err(sql("meta"))?;
            c.execute_batch("COMMIT").map_err(sql("commit"))
        })
        .await
    }

    /// Abandons an update in progress, if any.
    pub async fn rollback(&self) -> Result<()> {
        self.with(|c| {
            if !c.is_autocommit() {
                c.execute_batch("ROLLBACK").map_err(sql("rollback"))?;
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: &str, pos: i64) -> RowAt {
        RowAt {
            file: file.into(),
            pos,
        }
    }

    #[tokio::test]
    async fn an_update_replaces_rows_and_records_its_snapshot_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path()).await.unwrap();
        assert_eq!(index.reflects("t").await.unwrap(), None);
        index.begin("t", true).await.unwrap();
        let rows = vec![
            ("[1]".to_string(), at("f1", 0), "{\"a\":1}".to_string()),
            ("[2]".to_string(), at("f1", 1), "{\"a\":2}".to_string()),
        ];
        index.add("t", rows).await.unwrap();
        let one = Reflects {
            uuid: "u".into(),
            snapshot: Some(7),
        };
        index.commit("t", one.clone()).await.unwrap();
        assert_eq!(index.reflects("t").await.unwrap(), Some(one));

        // Key 1 replaced, key 2 deleted; left unfinished, nothing of it shows.
        index.begin("t", false).await.unwrap();
        index
            .remove_at("t", vec![at("f1", 0), at("f1", 1)])
            .await
            .unwrap();
        index.rollback().await.unwrap();
        let found = index.docs("t", vec!["[1]".into(), "[2]".into()]).await;
        assert_eq!(found.unwrap().len(), 2);

        index.begin("t", false).await.unwrap();
        index
            .remove_at("t", vec![at("f1", 0), at("f1", 1)])
            .await
            .unwrap();
        let rows = vec![("[1]".to_string(), at("f2", 0), "{\"a\":3}".to_string())];
        index.add("t", rows).await.unwrap();
        let two = Reflects {
            uuid: "u".into(),
            snapshot: Some(8),
        };
        index.commit("t", two).await.unwrap();
        let found = index.rows_at("t", vec!["[1]".into(), "[2]".into()]).await;
        assert_eq!(found.unwrap(), vec![Some(at("f2", 0)), None]);
        let docs = index.docs("t", vec!["[1]".into(), "[2]".into()]).await;
        assert_eq!(docs.unwrap(), vec!["{\"a\":3}".to_string()]);
    }

    #[tokio::test]
    async fn a_second_live_row_of_a_key_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path()).await.unwrap();
        index.begin("t", true).await.unwrap();
        let rows = vec![
            ("[1]".to_string(), at("f1", 0), "{}".to_string()),
            ("[1]".to_string(), at("f2", 0), "{}".to_string()),
        ];
        let err = index.add("t", rows).await.unwrap_err();
        assert!(
            matches!(&err, SinkError::Corrupt(m) if m.contains("two live rows")),
            "{err}"
        );
    }
}
