//! The local view: each binding's view, the runtime checkpoint and the range's fence,
//! in one SQLite file beside the recovery log (`<state_dir>/view.db`), the default
//! store of an output materialization. Synchronous: [`super::View`] calls it on the
//! blocking pool.
//!
//! ```text
//!  docs(binding, key, doc)           the view: each key's reduced document
//!  ranges(key_begin, key_end, fence, checkpoint)
//!  snapshots(binding, txn)           bindings whose snapshot batch was sent
//!  meta(name, value)                 generation, adopts_unstamped: the view's generation
//! ```
//!
//! A transaction's writes are one SQLite transaction (WAL, `synchronous=FULL`): what
//! the view says after a crash is a transaction's whole result, never part of one.
//!
//! The view is created with its generation ([`crate::generation`]) and removed whole by
//! a reset ([`remove`]): documents, checkpoint, fence, snapshots and generation go
//! together, so the next run is a new materialization, never the old checkpoint over
//! an empty view.

use super::Write;
use crate::generation::{Generation, GenerationId};
use crate::{OutputError, Result};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;

/// The view's file in its folder.
pub const FILE: &str = "view.db";

/// The view's file, and the files SQLite keeps beside it.
const FILES: [&str; 4] = [FILE, "view.db-wal", "view.db-shm", "view.db-journal"];

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS docs (
    binding TEXT NOT NULL, key BLOB NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (binding, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ranges (
    key_begin INTEGER NOT NULL, key_end INTEGER NOT NULL,
    fence INTEGER NOT NULL, checkpoint BLOB NOT NULL,
    PRIMARY KEY (key_begin, key_end));
CREATE TABLE IF NOT EXISTS snapshots (binding TEXT PRIMARY KEY, txn INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
";

fn sql_error(context: &str, err: rusqlite::Error) -> OutputError {
    OutputError::External(format!("output view: {context}: {err}"))
}

pub(crate) struct LocalView {
    conn: Connection,
    in_transaction: bool,
    generation: Generation,
}

/// Removes the view under `state_dir` whole (a reset: `sluice apply --delete`), if it
/// exists; returns the generation it ended. Returns once the removal is durable
/// (the folder fsync'ed). The caller holds the recovery log's lock, so no run has the
/// view open.
pub fn remove(state_dir: &Path) -> Result<Option<GenerationId>> {
    let io = |what: &str, path: &Path, e: std::io::Error| {
        OutputError::External(format!("{what} {}: {e}", path.display()))
    };
    if !state_dir.join(FILE).exists() {
        return Ok(None);
    }
    let generation = LocalView::open(state_dir)?.generation.id;
    for name in FILES {
        let path = state_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing", &path, e)),
        }
    }
    std::fs::File::open(state_dir)
        .and_then(|folder| folder.sync_all())
        .map_err(|e| io("syncing", state_dir, e))?;
    Ok(Some(generation))
}

impl LocalView {
    /// Opens (creating) the view file under `state_dir`; a view created now gets a new
    /// generation.
    pub fn open(state_dir: &Path) -> Result<LocalView> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| OutputError::External(format!("creating {}: {e}", state_dir.display())))?;
        let path = state_dir.join(FILE);
        let conn = Connection::open(&path)
            .map_err(|e| sql_error(&format!("opening {}", path.display()), e))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=-65536;",
        )
        .and_then(|()| conn.execute_batch(SCHEMA))
        .map_err(|e| sql_error("creating its tables", e))?;
        let generation = generation(&conn)?;
        Ok(LocalView {
            conn,
            in_transaction: false,
            generation,
        })
    }

    /// The generation of what is written from this view.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Claims the key range: raises its fence and returns the new fence and the
    /// checkpoint committed last (empty if none).
    pub fn claim(&mut self, key_begin: u32, key_end: u32) -> Result<(i64, Vec<u8>)> {
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_error("claiming the key range", e))?;
        let current: Option<(i64, Vec<u8>)> = tx
            .query_row(
                "SELECT fence, checkpoint FROM ranges WHERE key_begin = ?1 AND key_end = ?2",
                params![key_begin, key_end],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|e| sql_error("reading the range's fence", e))?;
        let (fence, checkpoint) = current.map(|(f, c)| (f + 1, c)).unwrap_or((1, Vec::new()));
        tx.execute(
            "INSERT INTO ranges (key_begin, key_end, fence, checkpoint) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (key_begin, key_end) DO UPDATE SET fence = excluded.fence",
            params![key_begin, key_end, fence, checkpoint],
        )
        .and_then(|_| tx.commit())
        .map_err(|e| sql_error("raising the range's fence", e))?;
        Ok((fence, checkpoint))
    }

    pub fn fence(&self, key_begin: u32, key_end: u32) -> Result<Option<i64>> {
        self.conn
            .query_row(
                "SELECT fence FROM ranges WHERE key_begin = ?1 AND key_end = ?2",
                params![key_begin, key_end],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| sql_error("reading the range's fence", e))
    }

    /// Starts the transaction's writes, if not started.
    pub fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|e| sql_error("beginning a transaction", e))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// The document of `key` in `binding`'s view, as this transaction sees it.
    pub fn get(&self, binding: &str, key: &[u8]) -> Result<Option<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT doc FROM docs WHERE binding = ?1 AND key = ?2")
            .map_err(|e| sql_error("preparing a lookup", e))?;
        stmt.query_row(params![binding, key], |row| row.get(0))
            .optional()
            .map_err(|e| sql_error("looking up a key", e))
    }

    /// The documents of `keys` in `binding`'s view (`None`: absent), in their order.
    pub fn get_many(&self, binding: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<String>>> {
        keys.iter().map(|key| self.get(binding, key)).collect()
    }

    /// Writes a run's new documents and removals (each key once), in this transaction.
    pub fn write(&mut self, binding: &str, writes: &[Write]) -> Result<()> {
        self.begin()?;
        for (key, doc) in writes {
            self.put(binding, key, doc.as_deref())?;
        }
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) `key`'s document.
    fn put(&mut self, binding: &str, key: &[u8], doc: Option<&str>) -> Result<()> {
        let (sql, result) = match doc {
            Some(doc) => {
                let sql = "INSERT INTO docs (binding, key, doc) VALUES (?1, ?2, ?3)
                           ON CONFLICT (binding, key) DO UPDATE SET doc = excluded.doc";
                let stmt = self.conn.prepare_cached(sql);
                (
                    sql,
                    stmt.and_then(|mut s| s.execute(params![binding, key, doc])),
                )
            }
            None => {
                let sql = "DELETE FROM docs WHERE binding = ?1 AND key = ?2";
                let stmt = self.conn.prepare_cached(sql);
                (sql, stmt.and_then(|mut s| s.execute(params![binding, key])))
            }
        };
        result
            .map(drop)
            .map_err(|e| sql_error(&format!("writing the view ({sql})"), e))
    }

    /// Up to `limit` documents of `binding`'s view after `after` (in key order).
    pub fn scan(
        &self,
        binding: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT key, doc FROM docs WHERE binding = ?1 AND key > ?2 ORDER BY key LIMIT ?3",
            )
            .map_err(|e| sql_error("preparing a scan", e))?;
        let rows = stmt
            .query_map(
                params![binding, after.unwrap_or(&[]), limit as i64],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| sql_error("scanning the view", e))?;
        Ok(rows)
    }

    /// Whether `binding`'s snapshot batch was sent.
    pub fn snapshot_sent(&self, binding: &str) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT 1 FROM snapshots WHERE binding = ?1",
                params![binding],
                |_| Ok(()),
            )
            .optional()
            .map(|row| row.is_some())
            .map_err(|e| sql_error("reading the snapshots sent", e))
    }

    /// Commits the transaction with `checkpoint` and the snapshots it sent, if the
    /// range's fence is still `fence`; otherwise rolls back and says who holds it.
    pub fn commit(
        &mut self,
        key_begin: u32,
        key_end: u32,
        fence: i64,
        checkpoint: &[u8],
        snapshots: &[(String, u64)],
    ) -> Result<Option<i64>> {
        self.begin()?;
        let current = self.fence(key_begin, key_end)?;
        if current != Some(fence) {
            self.rollback();
            return Ok(current);
        }
        let written = (|| {
            self.conn.execute(
                "UPDATE ranges SET checkpoint = ?3 WHERE key_begin = ?1 AND key_end = ?2",
                params![key_begin, key_end, checkpoint],
            )?;
            for (binding, txn) in snapshots {
                self.conn.execute(
                    "INSERT OR REPLACE INTO snapshots (binding, txn) VALUES (?1, ?2)",
                    params![binding, *txn as i64],
                )?;
            }
            self.conn.execute_batch("COMMIT")
        })();
        match written {
            Ok(()) => {
                self.in_transaction = false;
                Ok(Some(fence))
            }
            Err(err) => {
                self.rollback();
                Err(sql_error("committing", err))
            }
        }
    }

    /// Rolls the transaction back, if one is open.
    pub fn rollback(&mut self) {
        if self.in_transaction {
            if let Err(err) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(%err, "rolling back the output view's transaction");
            }
            self.in_transaction = false;
        }
    }

    /// Copies `from`'s view into `binding`'s (empty) view, in one transaction.
    pub fn seed(&mut self, binding: &str, from: &str) -> Result<usize> {
        self.conn
            .execute(
                "INSERT INTO docs (binding, key, doc) SELECT ?1, key, doc FROM docs WHERE binding = ?2",
                params![binding, from],
            )
            .map_err(|e| sql_error("seeding a binding's view", e))
    }
}

/// The view's generation, minted (in one transaction with the check) if it has none:
/// a view that already holds a range was made by a release before generations, and
/// adopts what that release wrote unstamped.
fn generation(conn: &Connection) -> Result<Generation> {
    let read = |conn: &Connection| -> rusqlite::Result<Option<(String, String)>> {
        conn.query_row(
            "SELECT (SELECT value FROM meta WHERE name = 'generation'),
                    (SELECT value FROM meta WHERE name = 'adopts_unstamped')",
            [],
            |row| Ok(row.get::<_, Option<String>>(0)?.zip(row.get(1)?)),
        )
    };
    let parse = |(id, adopts): (String, String)| -> Result<Generation> {
        let id = GenerationId::parse(&id)
            .map_err(|e| OutputError::Corrupt(format!("output view: {e}")))?;
        Ok(Generation {
            id,
            adopts_unstamped: adopts == "1",
        })
    };
    if let Some(found) = read(conn).map_err(|e| sql_error("reading its generation", e))? {
        return parse(found);
    }
    let minted = (|| {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        if let Some(found) = read(conn)? {
            conn.execute_batch("COMMIT")?;
            return Ok(found);
        }
        let claimed: bool =
            conn.query_row("SELECT EXISTS (SELECT 1 FROM ranges)", [], |r| r.get(0))?;
        let found = (
            GenerationId::mint().to_string(),
            if claimed { "1" } else { "0" }.to_string(),
        );
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('generation', ?1), ('adopts_unstamped', ?2)",
            params![found.0, found.1],
        )?;
        conn.execute_batch("COMMIT")?;
        Ok(found)
    })();
    match minted {
        Ok(found) => {
            let generation = parse(found)?;
            tracing::info!(generation = %generation.id, adopts_unstamped = generation.adopts_unstamped,
                "a new output view: its generation");
            Ok(generation)
        }
        Err(err) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(sql_error("minting its generation", err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The view's promises, for both stores: `super::tests`. What is the file's own:

    #[test]
    fn a_reset_removes_the_views_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut view = LocalView::open(dir.path()).unwrap();
        let generation = view.generation().id;
        view.claim(0, u32::MAX).unwrap();
        view.write("b", &[(b"k1".to_vec(), Some("{}".into()))])
            .unwrap();
        view.commit(0, u32::MAX, 1, b"cp1", &[]).unwrap();
        drop(view);
        assert_eq!(remove(dir.path()).unwrap(), Some(generation));
        assert!(FILES.iter().all(|f| !dir.path().join(f).exists()));
    }

    #[test]
    fn a_view_from_before_generations_adopts_what_it_wrote_unstamped() {
        let dir = tempfile::tempdir().unwrap();
        {
            // The previous release's view: no meta table, a claimed range.
            let conn = Connection::open(dir.path().join("view.db")).unwrap();
            let old_schema = SCHEMA.replace(
                "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;",
                "",
            );
            conn.execute_batch(&old_schema).unwrap();
            conn.execute("INSERT INTO ranges VALUES (0, 4294967295, 3, x'6370')", [])
                .unwrap();
        }
        let mut view = LocalView::open(dir.path()).unwrap();
        let generation = view.generation();
        assert!(generation.adopts_unstamped);
        assert_eq!(view.claim(0, u32::MAX).unwrap(), (4, b"cp".to_vec()));
        drop(view);
        assert_eq!(
            LocalView::open(dir.path()).unwrap().generation(),
            generation
        );
    }
}
