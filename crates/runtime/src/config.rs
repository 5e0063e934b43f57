//! The pipeline file: what the operator writes (YAML), checked before anything runs.
//!
//! ```text
//!  text ──YAML──▶ tree ──${ENV} expansion──▶ tree ──serde (deny unknown)──▶ Pipeline
//!                                                      ──resolve paths, cross-check──▶
//! ```
//!
//! Every error names its place in the file the way a reader finds it,
//! `materializations.views-db.bindings[0].source: unknown collection "acme/x"`, and YAML
//! syntax errors name line and column. Unknown keys are errors: a typo must not be
//! silently ignored. `${NAME}` expands in every string value, `${NAME:-default}` to the
//! default when NAME is unset or empty (`$${` writes a literal `${`); an unset variable
//! without a default is an error naming it and its place; each default taken is
//! recorded ([`Pipeline::defaulted`], see [`env`]). Relative paths
//! (files, databases, the recovery log, a command's program when it contains `/`)
//! resolve against the pipeline file's folder.
//!
//! A source and an endpoint each name exactly one *kind* by a key (`file: {...}`,
//! `sqlite: {...}`), looked up in the [`Registry`] the binary fills: the kind parses
//! and checks its own configuration (and resolves its own paths), and its errors are
//! placed under its key (`sources.views.file.path: ...`). This file knows no kind.

use crate::envelope::Envelope;
use crate::registry::Registry;
use serde::Deserialize;
use serde_json::{Map, Value};
use serde_yaml_ng::Value as Yaml;
use sluice_doc::Pointer;
pub use sluice_source_sdk::config::parse_duration;
use sluice_source_sdk::config::{de_bytes, de_duration, resolve_path};
use sluice_source_sdk::{InvalidConfig, SourceConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod env;

pub use crate::types::EndpointDef;
pub use env::Defaulted;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read pipeline file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("invalid YAML at line {line} column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// `place` is the dotted path of the offending value (`sources.x.file.path`).
    #[error("{place}: {message}")]
    Invalid { place: String, message: String },
}

fn invalid(place: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        place: place.into(),
        message: message.into(),
    }
}

/// A parsed and checked pipeline file.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub collections: BTreeMap<String, CollectionDef>,
    pub sources: BTreeMap<String, SourceDef>,
    pub materializations: BTreeMap<String, MaterializationDef>,
    pub runtime: RuntimeDef,
    /// What every materialization must give (`delivery:`; admission checks each part).
    pub delivery: crate::admission::Delivery,
    /// `cluster:`: run as one member of a cluster coordinated through etcd, which
    /// assigns the materializations' shards; none: one process runs every one.
    pub cluster: Option<ClusterDef>,
    /// Every `${NAME:-default}` of the file that expanded to its default.
    pub defaulted: Vec<Defaulted>,
    /// The file's tree as read, `${ENV}` expanded, secrets included: the status page
    /// shows it redacted.
    pub file: Value,
}

/// `cluster:`: the etcd cluster the members coordinate through, and who this one is
/// (`docs/scale-out.md`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterDef {
    /// etcd client endpoints (`http://127.0.0.1:2379`).
    pub etcd: Vec<String>,
    /// This member's id, unique among the live members (`${HOSTNAME}` is typical).
    pub member: String,
    /// The key prefix the cluster's state lives under; defaults to
    /// `/sluice/<file stem>`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// A member silent this long loses its lease, and with it its shards.
    #[serde(default = "default_lease_ttl", deserialize_with = "de_duration")]
    pub lease_ttl: Duration,
    /// How many shards (equal key ranges) a materialization starts with when the
    /// cluster first sees it; `sluice shards split` makes more later.
    #[serde(default = "default_initial_shards")]
    pub shards: u32,
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(10)
}

fn default_initial_shards() -> u32 {
    1
}

/// The pipeline file as written: sources and endpoints not yet read by their kinds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    collections: BTreeMap<String, CollectionDef>,
    #[serde(default)]
    sources: BTreeMap<String, SourceFile>,
    #[serde(default)]
    materializations: BTreeMap<String, MaterializationFile>,
    #[serde(default)]
    runtime: RuntimeDef,
    #[serde(default)]
    delivery: crate::admission::Delivery,
    #[serde(default)]
    cluster: Option<ClusterDef>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionDef {
    pub key: Vec<Pointer>,
    /// A JSON schema with `reduce` annotations; compiled by `sluice_doc::Schema`.
    pub schema: Value,
}

/// A source writes into one collection; what it reads is up to its kind.
#[derive(Debug, Clone)]
pub struct SourceDef {
    pub target: String,
    pub on_error: OnError,
    /// With `on_error: skip`: the JSON-lines file rejected documents are appended to;
    /// defaults to `<recovery_log>/<materialization>/dead-letters.jsonl`.
    pub dead_letter: Option<PathBuf>,
    /// How much the source may read ahead before the runtime pauses it.
    pub read_ahead: ReadAhead,
    /// How its records wrap their documents (change events).
    pub envelope: Envelope,
    /// The source's kind (`file`, `datagen`) and its configuration, parsed by the kind.
    pub config: SourceConfig,
}

/// The runtime's backpressure on a source that reads ahead (a broker's): above either
/// bound of what it buffered, not yet queued, it is paused (`Source::pause`), and
/// extended again once its buffer is below both. Sources that read on demand (files,
/// datagen) buffer nothing and are never paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAhead {
    pub max_queued_records: usize,
    pub max_queued_bytes: u64,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead {
            max_queued_records: default_max_queued_records(),
            max_queued_bytes: default_max_queued_bytes(),
        }
    }
}

/// Enough for several fetches of a broker ahead of the loop, so reading never waits
/// on the network while a transaction commits.
fn default_max_queued_records() -> usize {
    100_000
}

/// 16 MiB: a few of a broker's fetches, and small beside the combiners' budgets (the
/// README's memory bound counts it per source).
fn default_max_queued_bytes() -> u64 {
    16 << 20
}

/// A source as written: the runtime's keys, and the others (exactly one: its kind).
#[derive(Deserialize)]
struct SourceFile {
    /// Checked after the kinds, so that a misspelt `target` is named as the unknown key
    /// it is, not reported as a missing `target`.
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    on_error: OnError,
    #[serde(default)]
    dead_letter: Option<PathBuf>,
    #[serde(default = "default_max_queued_records")]
    max_queued_records: usize,
    #[serde(default = "default_max_queued_bytes", deserialize_with = "de_bytes")]
    max_queued_bytes: u64,
    #[serde(default)]
    envelope: Envelope,
    #[serde(flatten)]
    kinds: Map<String, Value>,
}

impl SourceDef {
    /// Where a materialization whose recovery log is `log_dir` writes this source's
    /// rejected documents; `None` unless `on_error: skip`.
    pub fn dead_letter_path(&self, log_dir: &Path) -> Option<PathBuf> {
        match self.on_error {
            OnError::Fail => None,
            OnError::Skip => Some(
                self.dead_letter
                    .clone()
                    .unwrap_or_else(|| log_dir.join(DEAD_LETTER_FILE)),
            ),
        }
    }
}

/// The file name of a materialization's default dead-letter file, in its recovery log.
pub const DEAD_LETTER_FILE: &str = "dead-letters.jsonl";

/// What to do with a document of this source that is bad input: unparseable (malformed
/// JSON or CSV, invalid UTF-8, above `max_document_size`), invalid against the schema,
/// without its key, or failing to reduce with the documents of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the pipeline; the transaction that saw it does not commit.
    #[default]
    Fail,
    /// Append it, with its reason and position, to the dead-letter file (durably,
    /// before its transaction commits) and go on without it. A reduction that fails
    /// only against the stored document or across spilled runs still stops the
    /// pipeline: no single document can be blamed for it.
    Skip,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MaterializationDef {
    pub endpoint: EndpointDef,
    pub bindings: Vec<BindingDef>,
    pub shard: ShardDef,
}

/// A materialization as written: its endpoint not yet read by its kind.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MaterializationFile {
    endpoint: Map<String, Value>,
    bindings: Vec<BindingDef>,
    #[serde(default)]
    shard: ShardDef,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingDef {
    /// The collection materialized.
    pub source: String,
    /// Where it goes, in the driver's terms (e.g. `{table: pageviews}`).
    pub resource: Value,
    #[serde(default)]
    pub delta_updates: bool,
    #[serde(default)]
    pub fields: Option<FieldsDef>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsDef {
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// The key-hash range of a materialization shard, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardDef {
    pub key_begin: u32,
    pub key_end: u32,
}

impl ShardDef {
    /// The shard's id as metrics, logs and a cluster name it: `00000000-7fffffff`.
    pub fn id(&self) -> String {
        crate::types::shard_label(self.key_begin, self.key_end)
    }

    /// Reads an [`id`](Self::id).
    pub fn parse(id: &str) -> Option<ShardDef> {
        let (begin, end) = id.split_once('-')?;
        if begin.len() != 8 || end.len() != 8 {
            return None;
        }
        let shard = ShardDef {
            key_begin: u32::from_str_radix(begin, 16).ok()?,
            key_end: u32::from_str_radix(end, 16).ok()?,
        };
        (shard.key_begin <= shard.key_end).then_some(shard)
    }

    /// `n` equal ranges covering every key, in order.
    pub fn split_evenly(n: u32) -> Vec<ShardDef> {
        let n = u64::from(n.max(1));
        let span = (u64::from(u32::MAX) + 1) / n;
        (0..n)
            .map(|i| ShardDef {
                key_begin: (i * span) as u32,
                key_end: if i + 1 == n {
                    u32::MAX
                } else {
                    ((i + 1) * span - 1) as u32
                },
            })
            .collect()
    }

    /// The two halves a split at the midpoint makes; `None` for a range of one hash.
    pub fn halves(&self) -> Option<(ShardDef, ShardDef)> {
        if self.key_begin == self.key_end {
            return None;
        }
        let mid = self.key_begin + (self.key_end - self.key_begin) / 2;
        let low = ShardDef {
            key_begin: self.key_begin,
            key_end: mid,
        };
        let high = ShardDef {
            key_begin: mid + 1,
            key_end: self.key_end,
        };
        Some((low, high))
    }
}

impl Default for ShardDef {
    fn default() -> Self {
        ShardDef {
            key_begin: 0,
            key_end: u32::MAX,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeDef {
    /// Directory of the recovery log; defaults to `.sluice/<file stem>` beside the file.
    #[serde(default)]
    pub recovery_log: Option<PathBuf>,
    #[serde(default)]
    pub transactions: TxnBounds,
    /// What each combiner of a shard may hold before it spills to disk. A shard has up
    /// to three at once (the reader's, and the two of the committer's load phase), plus
    /// the documents the last transaction stored (kept only if they fit one budget), so
    /// its documents take at most about four times this.
    #[serde(default = "default_memory_budget", deserialize_with = "de_bytes")]
    pub memory_budget: u64,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Where to serve Prometheus metrics on `/metrics` (`127.0.0.1:9464`); none by
    /// default. `sluice run --metrics` overrides it.
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for RuntimeDef {
    fn default() -> Self {
        RuntimeDef {
            recovery_log: None,
            transactions: TxnBounds::default(),
            memory_budget: default_memory_budget(),
            timeouts: Timeouts::default(),
            metrics: None,
        }
    }
}

/// How long the runtime waits on an external system before it gives up on the attempt:
/// a timeout is a retryable error (the loop reopens with backoff, and recovery makes
/// the restart exact), so a hung store or source never stops the pipeline forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Every wait on a driver: Spec, Validate and Apply; starting a Transactions
    /// stream; the driver taking a request; and its next message while it owes an
    /// answer (Opened, Acknowledged, Loaded or Prepared after Prepare, DriverCommitted).
    #[serde(default = "default_driver_timeout", deserialize_with = "de_duration")]
    pub driver: Duration,
    /// Every call to a source: seek, replay, queue.
    #[serde(default = "default_source_timeout", deserialize_with = "de_duration")]
    pub source: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            driver: default_driver_timeout(),
            source: default_source_timeout(),
        }
    }
}

/// 5 minutes. The longest healthy silence of a driver is one statement of the store:
/// the lookup of a Prepare's deferred loads before its first Loaded, the commit of a
/// transaction of `max_bytes` (256 MiB by default) before DriverCommitted. Each takes
/// seconds to a minute on a loaded server; the wait restarts at every message, so a
/// large transaction of many messages never adds up against it.
fn default_driver_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

/// 1 minute. A source call returns what it has at once (`queue` returns an empty step
/// when nothing is new), and one call reads at most a few thousand records, so only a
/// hung system takes this long.
fn default_source_timeout() -> Duration {
    Duration::from_secs(60)
}

/// 256 MiB: room for about 430 000 keys of small (150-byte) documents per combiner.
fn default_memory_budget() -> u64 {
    256 << 20
}

/// When a transaction closes: at `max_docs`, `max_bytes` or `max_duration`, whichever
/// comes first, but not before `min_duration` (which batches a trickle of input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxnBounds {
    #[serde(default = "default_max_docs")]
    pub max_docs: u64,
    #[serde(default = "default_max_bytes", deserialize_with = "de_bytes")]
    pub max_bytes: u64,
    #[serde(default = "default_max_duration", deserialize_with = "de_duration")]
    pub max_duration: Duration,
    #[serde(default, deserialize_with = "de_duration")]
    pub min_duration: Duration,
}

impl Default for TxnBounds {
    fn default() -> Self {
        TxnBounds {
            max_docs: default_max_docs(),
            max_bytes: default_max_bytes(),
            max_duration: default_max_duration(),
            min_duration: Duration::ZERO,
        }
    }
}

/// 1M documents / 256 MiB / 5 s. A transaction closes early whenever the committer is
/// idle and the sources have caught up, so these bounds only matter while it is busy or
/// a backlog is read: then the reader keeps combining, and repeated keys collapse before
/// they cost a load and a store (a reduced view's whole point). A replay after a crash re-reads at most one such transaction (a few
/// seconds); the combiners spill beyond their memory budget.
fn default_max_docs() -> u64 {
    1_000_000
}
fn default_max_bytes() -> u64 {
    256 << 20
}
fn default_max_duration() -> Duration {
    Duration::from_secs(5)
}

impl Pipeline {
    /// Reads, parses and checks the pipeline file at `path`, whose sources and endpoints
    /// are of the kinds `registry` knows.
    pub fn load(path: &Path, registry: &Registry) -> Result<Pipeline, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "pipeline".to_string());
        Self::parse_named(&text, base_dir, &stem, registry)
    }

    /// Parses pipeline text whose relative paths are relative to `base_dir`. The
    /// default recovery log is `base_dir/.sluice/pipeline`.
    pub fn parse(
        text: &str,
        base_dir: &Path,
        registry: &Registry,
    ) -> Result<Pipeline, ConfigError> {
        Self::parse_named(text, base_dir, "pipeline", registry)
    }

    fn parse_named(
        text: &str,
        base_dir: &Path,
        stem: &str,
        registry: &Registry,
    ) -> Result<Pipeline, ConfigError> {
        let tree: Yaml = serde_yaml_ng::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            ConfigError::Syntax {
                line,
                column,
                message: e.to_string(),
            }
        })?;
        // Through JSON: YAML's own enum form is a tag (`!sqlite`), we want `sqlite: {..}`.
        let mut tree = serde_json::to_value(tree)
            .map_err(|e| invalid("(top level)", format!("not representable as JSON: {e}")))?;
        let mut defaulted = Vec::new();
        env::expand(&mut tree, &mut String::new(), &mut defaulted)?;
        for d in &defaulted {
            tracing::debug!(place = %d.place, "{}", d.explain());
        }
        let file: PipelineFile = serde_path_to_error::deserialize(&tree).map_err(|e| {
            let place = e.path().to_string();
            let place = if place == "." {
                "(top level)".to_string()
            } else {
                place
            };
            invalid(place, e.into_inner().to_string())
        })?;
        let mut pipeline = file.read_kinds(base_dir, registry)?;
        pipeline.defaulted = defaulted;
        pipeline.file = tree;
        pipeline.resolve_paths(base_dir, stem);
        pipeline.check()?;
        Ok(pipeline)
    }

    /// Resolves the paths the runtime itself reads (kinds resolve their own).
    fn resolve_paths(&mut self, base: &Path, stem: &str) {
        for source in self.sources.values_mut() {
            if let Some(path) = &mut source.dead_letter {
                resolve_path(path, base);
            }
        }
        let log = self
            .runtime
            .recovery_log
            .get_or_insert_with(|| Path::new(".sluice").join(stem));
        resolve_path(log, base);
        if let Some(cluster) = &mut self.cluster {
            cluster
                .prefix
                .get_or_insert_with(|| format!("/sluice/{stem}"));
            // A member keeps what stays local (dead letters, the spill files' folder)
            // in a folder of its own: members may share a machine and a file.
            *log = log.join("members").join(&cluster.member);
        }
    }

    /// The directory of the recovery log (always set after parsing).
    pub fn recovery_log(&self) -> &Path {
        self.runtime
            .recovery_log
            .as_deref()
            .expect("resolve_paths sets the recovery log")
    }

    /// The sources feeding materialization `name` (those whose target it binds).
    pub fn sources_of(&self, name: &str) -> impl Iterator<Item = (&String, &SourceDef)> {
        let bindings = self.materializations.get(name).map(|m| &m.bindings);
        self.sources
            .iter()
            .filter(move |(_, s)| bindings.is_some_and(|b| b.iter().any(|b| b.source == s.target)))
    }

    /// The dead-letter files materialization `name` writes (one per path, sorted).
    /// The folder a source keeps its own state in, for one materialization it feeds
    /// (`Opening::state_dir`): beside that materialization's recovery log.
    pub fn source_state_dir(&self, materialization: &str, source: &str) -> PathBuf {
        self.recovery_log()
            .join(materialization)
            .join("sources")
            .join(source)
    }

    /// The folder a materialization's endpoint keeps its own state in (an output's
    /// views): beside that materialization's recovery log.
    pub fn endpoint_state_dir(&self, materialization: &str) -> PathBuf {
        self.recovery_log().join(materialization).join("endpoint")
    }

    pub fn dead_letter_paths(&self, name: &str) -> Vec<PathBuf> {
        let log_dir = self.recovery_log().join(name);
        let paths: std::collections::BTreeSet<PathBuf> = self
            .sources_of(name)
            .filter_map(|(_, s)| s.dead_letter_path(&log_dir))
            .collect();
        paths.into_iter().collect()
    }

    /// Cross-checks that serde cannot express.
    fn check(&self) -> Result<(), ConfigError> {
        let defined = || {
            self.collections
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        };
        let known = |place: String, name: &str| {
            if self.collections.contains_key(name) {
                Ok(())
            } else {
                Err(invalid(
                    place,
                    format!("unknown collection {name:?} (defined: {})", defined()),
                ))
            }
        };
        let timeouts = &self.runtime.timeouts;
        for (what, timeout) in [("driver", timeouts.driver), ("source", timeouts.source)] {
            if timeout.is_zero() {
                return Err(invalid(
                    format!("runtime.timeouts.{what}"),
                    "a timeout must be longer than 0, e.g. \"5m\"",
                ));
            }
        }
        for (name, c) in &self.collections {
            if c.key.is_empty() {
                return Err(invalid(
                    format!("collections.{name}.key"),
                    "a collection needs at least one key pointer, e.g. [/id]",
                ));
            }
            if let Err(e) = sluice_doc::Schema::compile(&c.schema) {
                return Err(invalid(format!("collections.{name}.schema"), e.to_string()));
            }
        }
        for (name, s) in &self.sources {
            known(format!("sources.{name}.target"), &s.target)?;
            if s.dead_letter.is_some() && s.on_error == OnError::Fail {
                return Err(invalid(
                    format!("sources.{name}.dead_letter"),
                    "is only written with `on_error: skip`; set that, or remove it",
                ));
            }
        }
        // A dead-letter file is rewritten on recovery by the one materialization that
        // writes it (see `deadletter`): two must not share one.
        let mut writers: BTreeMap<PathBuf, &str> = BTreeMap::new();
        for m in self.materializations.keys() {
            for (source, def) in self.sources_of(m) {
                let Some(path) = &def.dead_letter else {
                    continue;
                };
                if let Some(other) = writers.insert(path.clone(), m)
                    && other != m
                {
                    return Err(invalid(
                        format!("sources.{source}.dead_letter"),
                        format!(
                            "{} would be written by materializations {other} and {m}; \
                             give each its own file, or omit it to use each one's default",
                            path.display()
                        ),
                    ));
                }
            }
        }
        for (name, m) in &self.materializations {
            if m.bindings.is_empty() {
                return Err(invalid(
                    format!("materializations.{name}.bindings"),
                    "a materialization needs at least one binding",
                ));
            }
            for (i, b) in m.bindings.iter().enumerate() {
                known(
                    format!("materializations.{name}.bindings[{i}].source"),
                    &b.source,
                )?;
            }
            if m.shard.key_begin > m.shard.key_end {
                return Err(invalid(
                    format!("materializations.{name}.shard"),
                    "key_begin must not be above key_end",
                ));
            }
            if self.cluster.is_some() && m.shard != ShardDef::default() {
                return Err(invalid(
                    format!("materializations.{name}.shard"),
                    "a cluster assigns the shards' ranges itself: remove `shard`, and set \
                     `cluster.shards` or use `sluice shards split`",
                ));
            }
        }
        if let Some(cluster) = &self.cluster {
            if cluster.etcd.is_empty() {
                return Err(invalid("cluster.etcd", "name at least one etcd endpoint"));
            }
            let member_ok = !cluster.member.is_empty()
                && cluster
                    .member
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !member_ok {
                return Err(invalid(
                    "cluster.member",
                    format!(
                        "{:?} is not a member id: use letters, digits, `-`, `_` and `.`",
                        cluster.member
                    ),
                ));
            }
            if cluster.lease_ttl < Duration::from_secs(2) {
                return Err(invalid(
                    "cluster.lease_ttl",
                    "a lease shorter than 2s expires under ordinary pauses",
                ));
            }
            if !(1..=1024).contains(&cluster.shards) {
                return Err(invalid("cluster.shards", "between 1 and 1024"));
            }
        }
        Ok(())
    }
}

impl PipelineFile {
    /// Has each source's and endpoint's kind read its configuration.
    fn read_kinds(self, base_dir: &Path, registry: &Registry) -> Result<Pipeline, ConfigError> {
        let mut sources = BTreeMap::new();
        for (name, source) in self.sources {
            let place = format!("sources.{name}");
            let names = registry.source_names();
            let (_, config) = read_kind(
                &place,
                source.kinds,
                (SOURCE_FIELDS, &names),
                "source",
                |kind, config| {
                    let kind = registry
                        .source(kind)
                        .expect("one_kind returns a known kind");
                    kind.parse(config, base_dir)
                },
            )?;
            let target = source.target.ok_or_else(|| {
                invalid(
                    &place,
                    "missing field `target`: the collection this source writes into",
                )
            })?;
            let def = SourceDef {
                target,
                on_error: source.on_error,
                dead_letter: source.dead_letter,
                read_ahead: ReadAhead {
                    max_queued_records: source.max_queued_records,
                    max_queued_bytes: source.max_queued_bytes,
                },
                envelope: source.envelope,
                config,
            };
            sources.insert(name, def);
        }
        let mut materializations = BTreeMap::new();
        for (name, m) in self.materializations {
            let place = format!("materializations.{name}.endpoint");
            let names = registry.driver_names();
            let (kind, config) = read_kind(
                &place,
                m.endpoint,
                (&[], &names),
                "driver",
                |kind, config| {
                    let kind = registry
                        .driver(kind)
                        .expect("one_kind returns a known kind");
                    kind.parse(config, base_dir)
                },
            )?;
            let def = MaterializationDef {
                endpoint: EndpointDef { kind, config },
                bindings: m.bindings,
                shard: m.shard,
            };
            materializations.insert(name, def);
        }
        if self.cluster.is_some() {
            // A cluster moves shards between machines: what a part keeps outside the
            // recovery log would stay behind.
            let sources = (sources.iter()).map(|(name, s)| {
                let kind = registry
                    .source(s.config.kind())
                    .expect("parsed by its kind");
                (format!("sources.{name}"), kind.name(), kind.pinned())
            });
            let endpoints = (materializations.iter()).map(|(name, m)| {
                let kind = registry
                    .driver(&m.endpoint.kind)
                    .expect("parsed by its kind");
                let place = format!("materializations.{name}.endpoint");
                (place, kind.name(), kind.pinned(&m.endpoint.config))
            });
            for (place, kind, pinned) in sources.chain(endpoints) {
                if let Some(why) = pinned {
                    return Err(invalid(
                        place,
                        format!(
                            "a {kind} cannot run under `cluster:`, whose shards move between \
                             members: {why}; run it without `cluster:`"
                        ),
                    ));
                }
            }
        }
        Ok(Pipeline {
            collections: self.collections,
            sources,
            materializations,
            runtime: self.runtime,
            delivery: self.delivery,
            cluster: self.cluster,
            defaulted: Vec::new(),
            file: Value::Null,
        })
    }
}

/// Reads the one kind (of `what`, with names `known`) among the `keys` of the source or
/// endpoint at `place`: `parse(kind, config)`, its errors placed under the kind's key.
fn read_kind<T>(
    place: &str,
    keys: Map<String, Value>,
    (fields, known): (&[&str], &[&str]),
    what: &str,
    parse: impl FnOnce(&str, Value) -> Result<T, InvalidConfig>,
) -> Result<(String, T), ConfigError> {
    let (kind, config) =
        one_kind(keys, fields, known, what).map_err(|message| invalid(place, message))?;
    let config = parse(&kind, config)
        .map_err(|e| invalid(e.place_in(&format!("{place}.{kind}")), e.message))?;
    Ok((kind, config))
}

/// The keys of a source besides its kind (`SourceFile`), for naming a misspelt one.
const SOURCE_FIELDS: &[&str] = &[
    "target",
    "on_error",
    "dead_letter",
    "max_queued_records",
    "max_queued_bytes",
    "envelope",
];

/// The one kind among the keys left over in a source or endpoint, and its
/// configuration; `known` are the kinds (of `what`: "source", "driver") this binary has,
/// `fields` the part's other keys (for what an unknown key may have meant).
fn one_kind(
    keys: Map<String, Value>,
    fields: &[&str],
    known: &[&str],
    what: &str,
) -> Result<(String, Value), String> {
    let known_list = known.join(", ");
    if let Some(unknown) = keys.keys().find(|k| !known.contains(&k.as_str())) {
        let meant = (fields.iter().chain(known))
            .map(|name| (edit_distance(unknown, name), name))
            .filter(|&(distance, _)| distance <= 2)
            .min()
            .map(|(_, name)| format!(", did you mean `{name}`?"))
            .unwrap_or_default();
        return Err(format!(
            "unknown field `{unknown}`{meant} (the {what} kinds are {known_list})"
        ));
    }
    let mut kinds = keys.into_iter();
    match (kinds.next(), kinds.next()) {
        (Some(kind), None) => Ok(kind),
        (None, _) => Err(format!("set exactly one of the {what} kinds {known_list}")),
        (Some((first, _)), Some((second, _))) => Err(format!(
            "set exactly one of the {what} kinds {known_list}, not both `{first}` and `{second}`"
        )),
    }
}

/// Levenshtein distance of `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_or_endpoint_names_exactly_one_known_kind() {
        let known = ["datagen", "file"];
        for (keys, expected) in [
            (vec!["file"], Ok("file")),
            (vec!["datagen"], Ok("datagen")),
            (
                vec![],
                Err("set exactly one of the source kinds datagen, file"),
            ),
            (
                vec!["file", "datagen"],
                Err(
                    "set exactly one of the source kinds datagen, file, not both `datagen` and `file`",
                ),
            ),
            (
                vec!["kafka"],
                Err("unknown field `kafka` (the source kinds are datagen, file)"),
            ),
            (
                vec!["file", "kafka"],
                Err("unknown field `kafka` (the source kinds are datagen, file)"),
            ),
            (
                vec!["taget", "file"],
                Err(
                    "unknown field `taget`, did you mean `target`? (the source kinds are datagen, file)",
                ),
            ),
            (
                vec!["fille"],
                Err(
                    "unknown field `fille`, did you mean `file`? (the source kinds are datagen, file)",
                ),
            ),
        ] {
            let map: Map<String, Value> = keys
                .iter()
                .map(|k| (k.to_string(), Value::String(format!("{k} config"))))
                .collect();
            let got = one_kind(map, SOURCE_FIELDS, &known, "source");
            match expected {
                Ok(kind) => assert_eq!(
                    got,
                    Ok((kind.to_string(), Value::String(format!("{kind} config")))),
                    "{keys:?}"
                ),
                Err(message) => assert_eq!(got, Err(message.to_string()), "{keys:?}"),
            }
        }
    }
}
