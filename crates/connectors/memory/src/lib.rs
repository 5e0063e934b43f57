//! The reference driver: tables in memory (or in one JSON file), authoritative, fenced.
//!
//! [`MemoryDriver`] follows [`CommitPattern::RemoteAuthoritative`]: the store holds, per
//! materialization, its tables and one record per opened key range (a fence and the
//! runtime checkpoint committed with the data).
//!
//! ```text
//!  State ─ materialization ─┬─ shards: [key_begin, key_end] → (fence, checkpoint)
//!                           └─ tables: name → rows (hex packed key → document JSON)
//!                                             + a log of delta-updates documents
//! ```
//!
//! What it guarantees, and how:
//! - **Fencing.** `open` takes the next fence number of the materialization and writes it
//!   into every stored range that overlaps its own (creating the record of its own range,
//!   whose checkpoint is that of the narrowest stored range covering it). After `open`
//!   returns, every earlier instance of an overlapping range is fenced: its `commit`
//!   fails with [`Error::Fenced`], whatever it stored.
//! - **Atomic commit.** `commit` checks the fence, checks every stored document, then
//!   writes the rows and the runtime checkpoint in one step under one lock: all of the
//!   transaction or none of it. Checks are strict, as a SQL table's would be: a
//!   document stored with `exists = false` whose key is present, or with `exists = true`
//!   whose key is absent, fails the commit (the runtime's view of the store is wrong).
//!   A stored document whose JSON is `null` deletes the row (it must exist). For a
//!   delta-updates binding every document is appended to the table's log.
//! - **Read committed.** Loads read committed rows only; pending stores are kept in the
//!   transactor until `commit`.
//! - **Durability.** Without `path` the state lives as long as the [`MemoryDriver`]
//!   value (all its clones and transactors share it): nothing survives the process.
//!   With `path` the whole state is one JSON file, rewritten at every `open`, `commit`
//!   and `apply` (temporary file, fsync, rename, fsync of the folder) while holding an
//!   exclusive lock on `<path>.lock`; loads read it under a shared lock. Separate
//!   processes sharing the file therefore fence each other and never see a torn state.
//!   It is a test driver: the file is rewritten whole (cost grows with the data), and
//!   file I/O blocks the calling task.
//! - Tables are created by `apply` and, leniently, by the first commit that writes them.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m, constraint,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use sluice_driver_sdk::{CommitPattern, Driver, Error, LoadedSink, PriorState, Result, Transactor};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const ENDPOINT_SCHEMA: &str = r#"{"type":"object","properties":{"path":{"type":"string","description":"File holding the whole state; shared by processes. Omit to keep the state in memory."}},"additionalProperties":false}"#;
const RESOURCE_SCHEMA: &str = r#"{"type":"object","properties":{"table":{"type":"string"},"delta_updates":{"type":"boolean"}},"required":["table"],"additionalProperties":false}"#;

/// The endpoint configuration: `{ "path"?: string }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub path: Option<PathBuf>,
}

/// The resource configuration of a binding: `{ "table": string, "delta_updates"?: bool }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceConfig {
    table: String,
    #[serde(default)]
    delta_updates: bool,
}

fn parse<'a, T: Deserialize<'a>>(what: &str, json: &'a str) -> Result<T> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(json)
        .map_err(|e| Error::Config(format!("{what} of the memory driver: {e} (in {json})")))
}

/// Everything the driver stores.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct State {
    materializations: BTreeMap<String, MaterializationState>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct MaterializationState {
    /// The last fence handed out; fences only grow.
    last_fence: u64,
    shards: Vec<Shard>,
    tables: BTreeMap<String, Table>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shard {
    key_begin: u32,
    key_end: u32,
    fence: u64,
    /// The runtime checkpoint committed last by this range.
    checkpoint: Vec<u8>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Table {
    /// Hex of the packed key (same order as the bytes) → document JSON.
    rows: BTreeMap<String, String>,
    /// Documents of delta-updates bindings, in commit order: (hex key, document JSON).
    log: Vec<(String, String)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// Where the state lives: this value's memory, or a file shared by processes.
#[derive(Clone)]
enum Backend {
    Memory(Arc<Mutex<State>>),
    File(PathBuf),
}

impl Backend {
    /// Runs `f` over the state and keeps its changes only if it succeeds. With a file,
    /// returns only after the new state is durable (fsync of file and folder).
    fn update<R>(&self, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        match self {
            Backend::Memory(state) => f(&mut state.lock().unwrap_or_else(|p| p.into_inner())),
            Backend::File(path) => {
                let _lock = lock_file(path, true)?;
                let mut state = read_file(path)?;
                let out = f(&mut state)?;
                write_file(path, &state)?;
                Ok(out)
            }
        }
    }

    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> Result<R> {
        match self {
            Backend::Memory(state) => Ok(f(&state.lock().unwrap_or_else(|p| p.into_inner()))),
            Backend::File(path) => {
                let _lock = lock_file(path, false)?;
                Ok(f(&read_file(path)?))
            }
        }
    }
}

fn io_error(path: &Path, what: &str, err: std::io::Error) -> Error {
    Error::store(
        format!("memory driver: {what} {}", path.display()),
        err,
        true,
    )
}

/// Locks `<path>.lock` (never renamed, unlike the state file). Unlocks on drop.
fn lock_file(path: &Path, exclusive: bool) -> Result<File> {
    let lock_path = path.with_extension("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_error(&lock_path, "opening", e))?;
    let locked = if exclusive {
        file.lock()
    } else {
        file.lock_shared()
    };
    locked.map_err(|e| io_error(&lock_path, "locking", e))?;
    Ok(file)
}

fn read_file(path: &Path) -> Result<State> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            Error::store(
                format!("memory driver: parsing {}", path.display()),
                e,
                false,
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(io_error(path, "reading", e)),
    }
}

/// Writes the state next to `path`, fsyncs it, renames it over `path`, fsyncs the folder.
fn write_file(path: &Path, state: &State) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes =
        serde_json::to_vec(state).map_err(|e| Error::store("memory driver: encoding", e, false))?;
    let mut file = File::create(&tmp).map_err(|e| io_error(&tmp, "creating", e))?;
    file.write_all(&bytes)
        .map_err(|e| io_error(&tmp, "writing", e))?;
    file.sync_all().map_err(|e| io_error(&tmp, "syncing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, "renaming over", e))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "syncing folder", e))
}

/// The reference driver. Clones share one state, so two Opens on it fence each other.
#[derive(Clone, Default)]
pub struct MemoryDriver {
    state: Arc<Mutex<State>>,
}

/// One row of a table as the tests read it.
pub type Row = (Vec<u8>, serde_json::Value);

impl MemoryDriver {
    pub fn new() -> Self {
        Self::default()
    }

    fn backend(&self, endpoint_spec_json: &str) -> Result<Backend> {
        let config: EndpointConfig = parse("endpoint config", endpoint_spec_json)?;
        Ok(match config.path {
            Some(path) => Backend::File(path),
            None => Backend::Memory(self.state.clone()),
        })
    }

    /// The rows of `table` in key order, then its delta-updates log, from this value's
    /// memory. For a driver configured with `path`, use [`MemoryDriver::rows_in_file`].
    pub fn rows(&self, materialization: &str, table: &str) -> Vec<Row> {
        rows_of(
            &self.state.lock().unwrap_or_else(|p| p.into_inner()),
            materialization,
            table,
        )
    }

    /// Like [`MemoryDriver::rows`], from the state file at `path`.
    pub fn rows_in_file(path: &Path, materialization: &str, table: &str) -> Result<Vec<Row>> {
        Backend::File(path.to_path_buf()).read(|s| rows_of(s, materialization, table))
    }

    /// The runtime checkpoint last committed by exactly the range `[key_begin, key_end]`.
    pub fn checkpoint(
        &self,
        materialization: &str,
        key_begin: u32,
        key_end: u32,
    ) -> Option<Vec<u8>> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let shards = &state.materializations.get(materialization)?.shards;
        let shard = shards
            .iter()
            .find(|s| (s.key_begin, s.key_end) == (key_begin, key_end))?;
        Some(shard.checkpoint.clone())
    }
}

fn rows_of(state: &State, materialization: &str, table: &str) -> Vec<Row> {
    let Some(table) = state
        .materializations
        .get(materialization)
        .and_then(|m| m.tables.get(table))
    else {
        return Vec::new();
    };
    let rows = table
        .rows
        .iter()
        .chain(table.log.iter().map(|(k, v)| (k, v)));
    // Keys were written by `hex` and documents checked to be JSON at Store.
    rows.map(|(key, doc)| {
        (
            unhex(key),
            serde_json::from_str(doc).unwrap_or(serde_json::Value::Null),
        )
    })
    .collect()
}

/// The tables of a materialization's bindings, in binding order.
fn binding_tables(spec: &flow::MaterializationSpec) -> Result<Vec<(String, bool)>> {
    spec.bindings
        .iter()
        .map(|b| {
            let resource: ResourceConfig = parse("resource config", &b.resource_spec_json)?;
            Ok((resource.table, b.delta_updates))
        })
        .collect()
}

#[async_trait]
impl Driver for MemoryDriver {
    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: ENDPOINT_SCHEMA.into(),
            resource_spec_schema_json: RESOURCE_SCHEMA.into(),
            documentation_url: "https://docs.rs/sluice-driver/latest/sluice_driver_sdk/memory/"
                .into(),
        })
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.backend(&req.endpoint_spec_json)?;
        let bindings = req.bindings.iter().map(|binding| {
            let resource: ResourceConfig = parse("resource config", &binding.resource_spec_json)?;
            let collection = binding.collection.clone().unwrap_or_default();
            let constraints = collection.projections.iter().map(|p| {
                let (kind, reason) = if p.is_primary_key || collection.key_ptrs.contains(&p.ptr) {
                    (
                        constraint::Type::LocationRequired,
                        "part of the table's key",
                    )
                } else if p.ptr.is_empty() {
                    (
                        constraint::Type::FieldRequired,
                        "the document is what the table stores",
                    )
                } else {
                    (
                        constraint::Type::FieldOptional,
                        "stored inside the document anyway",
                    )
                };
                let c = m::Constraint {
                    r#type: kind as i32,
                    reason: reason.into(),
                };
                (p.field.clone(), c)
            });
            Ok(m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path: vec![resource.table],
                delta_updates: resource.delta_updates,
            })
        });
        Ok(m::ValidateResponse {
            bindings: bindings.collect::<Result<_>>()?,
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(
            self,
            req,
            "create",
            |tables, name| !tables.contains_key(name),
            |tables, name| {
                tables.insert(name.to_string(), Table::default());
            },
        )
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(
            self,
            req,
            "drop",
            |tables, name| tables.contains_key(name),
            |tables, name| {
                tables.remove(name);
            },
        )
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open.materialization.unwrap_or_default();
        let backend = self.backend(&spec.endpoint_spec_json)?;
        let bindings = binding_tables(&spec)?;
        let (begin, end) = (open.key_begin, open.key_end);
        let (fence, checkpoint) = backend.update(|state| {
            let mat = state
                .materializations
                .entry(spec.materialization.clone())
                .or_default();
            mat.last_fence += 1;
            let fence = mat.last_fence;
            let recovered = mat
                .shards
                .iter()
                .filter(|s| s.key_begin <= begin && end <= s.key_end)
                .min_by_key(|s| s.key_end - s.key_begin)
                .map(|s| s.checkpoint.clone())
                .unwrap_or_default();
            for shard in mat
                .shards
                .iter_mut()
                .filter(|s| s.key_begin <= end && begin <= s.key_end)
            {
                shard.fence = fence;
            }
            if !mat
                .shards
                .iter()
                .any(|s| (s.key_begin, s.key_end) == (begin, end))
            {
                mat.shards.push(Shard {
                    key_begin: begin,
                    key_end: end,
                    fence,
                    checkpoint: recovered.clone(),
                });
            }
            Ok((fence, recovered))
        })?;
        let transactor = MemoryTransactor {
            backend,
            materialization: spec.materialization,
            range: (begin, end),
            fence,
            bindings,
            checkpoint: Vec::new(),
            pending: Vec::new(),
        };
        Ok((
            Box::new(transactor),
            Opened {
                flow_checkpoint: checkpoint,
            },
        ))
    }
}

/// Shared body of ApplyUpsert and ApplyDelete: `verb` each table of the materialization
/// for which `needed` holds; describe only when `dry_run`.
fn apply(
    driver: &MemoryDriver,
    req: m::ApplyRequest,
    verb: &str,
    needed: fn(&BTreeMap<String, Table>, &str) -> bool,
    act: fn(&mut BTreeMap<String, Table>, &str),
) -> Result<m::ApplyResponse> {
    let spec = req.materialization.unwrap_or_default();
    let backend = driver.backend(&spec.endpoint_spec_json)?;
    let tables: BTreeSet<String> = binding_tables(&spec)?.into_iter().map(|(t, _)| t).collect();
    let describe = |state: &State| {
        let current = state
            .materializations
            .get(&spec.materialization)
            .map(|m| &m.tables);
        let empty = BTreeMap::new();
        let current = current.unwrap_or(&empty);
        let todo: Vec<String> = tables
            .iter()
            .filter(|t| needed(current, t))
            .cloned()
            .collect();
        todo
    };
    let todo = if req.dry_run {
        backend.read(describe)?
    } else {
        backend.update(|state| {
            let todo = describe(state);
            let mat = state
                .materializations
                .entry(spec.materialization.clone())
                .or_default();
            for table in &todo {
                act(&mut mat.tables, table);
            }
            Ok(todo)
        })?
    };
    let lines: Vec<String> = todo.iter().map(|t| format!("{verb} table {t}")).collect();
    Ok(m::ApplyResponse {
        action_description: lines.join("\n"),
    })
}

/// One document stored in the current transaction, applied at commit.
struct PendingStore {
    binding: usize,
    key: String,
    /// Document JSON; `null` deletes the row of a standard-updates binding.
    doc: String,
    exists: bool,
}

struct MemoryTransactor {
    backend: Backend,
    materialization: String,
    range: (u32, u32),
    fence: u64,
    /// Per binding: its table and whether it is delta-updates.
    bindings: Vec<(String, bool)>,
    /// The runtime checkpoint of the transaction being stored (from Prepare).
    checkpoint: Vec<u8>,
    pending: Vec<PendingStore>,
}

impl MemoryTransactor {
    fn table(&self, binding: usize) -> Result<&(String, bool)> {
        self.bindings.get(binding).ok_or_else(|| {
            Error::Config(format!(
                "binding {binding} is not part of the opened materialization"
            ))
        })
    }

    /// Every check of the commit, before anything is written.
    fn check(&self, mat: &MaterializationState, pending: &[PendingStore]) -> Result<()> {
        let (begin, end) = self.range;
        let shard = mat
            .shards
            .iter()
            .find(|s| (s.key_begin, s.key_end) == (begin, end));
        match shard {
            Some(s) if s.fence == self.fence => {}
            Some(s) => {
                return Err(Error::Fenced(format!(
                    "materialization {} range [{begin:08x}, {end:08x}] was opened again (fence {} > ours {})",
                    self.materialization, s.fence, self.fence
                )));
            }
            None => {
                return Err(Error::Fenced(format!(
                    "materialization {} range [{begin:08x}, {end:08x}] no longer exists in the store",
                    self.materialization
                )));
            }
        }
        let mut seen = BTreeSet::new();
        for p in pending {
            let (table, delta) = self.table(p.binding)?;
            if *delta {
                continue;
            }
            if !seen.insert((p.binding, p.key.as_str())) {
                return Err(self.rejected(p, table, "stored twice in one transaction"));
            }
            let present = mat
                .tables
                .get(table)
                .is_some_and(|t| t.rows.contains_key(&p.key));
            match (p.exists, present) {
                (false, true) => {
                    return Err(self.rejected(
                        p,
                        table,
                        "stored with exists=false but the row exists",
                    ));
                }
                (true, false) => {
                    return Err(self.rejected(
                        p,
                        table,
                        "stored with exists=true but the row is absent",
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn rejected(&self, p: &PendingStore, table: &str, why: &str) -> Error {
        Error::store(
            format!(
                "memory driver: commit to table {table} of {}",
                self.materialization
            ),
            format!("key {} {why}", p.key),
            false,
        )
    }
}

#[async_trait]
impl Transactor for MemoryTransactor {
    fn pattern(&self) -> CommitPattern {
        CommitPattern::RemoteAuthoritative
    }

    async fn load(
        &mut self,
        load: Load,
        _prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        let (table, _) = self.table(load.binding as usize)?;
        let keys = load_keys(&load)
            .map(|k| k.map(hex))
            .collect::<Result<Vec<_>>>()?;
        let found = self.backend.read(|state| {
            let rows = state
                .materializations
                .get(&self.materialization)
                .and_then(|m| m.tables.get(table));
            let found: Vec<String> = keys
                .iter()
                .filter_map(|k| rows?.rows.get(k).cloned())
                .collect();
            found
        })?;
        for doc in found {
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        self.checkpoint = prepare.flow_checkpoint;
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        })
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        self.table(store.binding as usize)?;
        for doc in store_docs(&store) {
            let doc = doc?;
            let text = std::str::from_utf8(doc.doc)
                .ok()
                .filter(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok())
                .ok_or_else(|| {
                    Error::Transport(format!(
                        "malformed message: Store of binding {}: a document is not JSON",
                        store.binding
                    ))
                })?;
            self.pending.push(PendingStore {
                binding: store.binding as usize,
                key: hex(doc.key),
                doc: text.to_string(),
                exists: doc.exists,
            });
        }
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let this = &*self;
        this.backend.update(|state| {
            let mat = state
                .materializations
                .entry(this.materialization.clone())
                .or_default();
            this.check(mat, &pending)?;
            // Nothing below fails: the transaction is applied whole.
            for p in pending {
                let (table, delta) = &this.bindings[p.binding];
                let table = mat.tables.entry(table.clone()).or_default();
                if *delta {
                    table.log.push((p.key, p.doc));
                } else if p.doc.trim() == "null" {
                    table.rows.remove(&p.key);
                } else {
                    table.rows.insert(p.key, p.doc);
                }
            }
            let (begin, end) = this.range;
            let shards = mat.shards.iter_mut();
            if let Some(shard) = shards
                .into_iter()
                .find(|s| (s.key_begin, s.key_end) == (begin, end))
            {
                shard.checkpoint = this.checkpoint.clone();
            }
            Ok(())
        })
    }

    async fn acknowledge(&mut self) -> Result<()> {
        Ok(())
    }
}
