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
//! placed under its key (`sources.views.file.path: ...`, `kinds.rs`). The runtime knows
//! no kind.
//!
//! By section of the file: `sources:` (`sources.rs`), `materializations:`
//! (`materializations.rs`), `runtime:` and `cluster:` (`runtime.rs`: the recovery log,
//! transaction bounds, memory, timeouts); this file holds the whole [`Pipeline`], its
//! `collections:`, and the cross-checks serde cannot express.

use crate::registry::Registry;
use serde::Deserialize;
use serde_json::Value;
use serde_yaml_ng::Value as Yaml;
use sluice_doc::Pointer;
pub use sluice_source_sdk::config::parse_duration;
use sluice_source_sdk::config::resolve_path;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod env;
mod kinds;
mod materializations;
mod runtime;
mod sources;

pub use crate::types::EndpointDef;
pub use env::Defaulted;
pub use materializations::{BindingDef, FieldsDef, MaterializationDef, ShardDef};
pub use runtime::{
    AutoSplit, Balance, ClusterDef, MetricsServer, RuntimeDef, Timeouts, TxnBounds, Workers,
};
pub use sources::{DEAD_LETTER_FILE, OnError, ReadAhead, SourceDef};

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

/// The pipeline file as written: sources and endpoints not yet read by their kinds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    collections: BTreeMap<String, CollectionDef>,
    #[serde(default)]
    sources: BTreeMap<String, sources::SourceFile>,
    #[serde(default)]
    materializations: BTreeMap<String, materializations::MaterializationFile>,
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
        env::expand(&mut tree, &mut String::new(), base_dir, &mut defaulted)?;
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
        if let Some(tls) = self.runtime.metrics.as_mut().and_then(|m| m.tls.as_mut()) {
            tls.resolve(base);
        }
        if let Some(cluster) = &mut self.cluster {
            if let Some(tls) = &mut cluster.tls {
                tls.resolve(base);
            }
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

    /// Why materialization `name` runs as one shard in this process whatever
    /// `runtime.workers` says, if it does: a part that cannot be read or written by
    /// several shards at once, or a dead-letter file (numbered by one shard's
    /// transactions).
    pub fn one_shard(&self, name: &str) -> Option<String> {
        let m = self.materializations.get(name)?;
        let sources = self.sources_of(name).find_map(|(source, s)| {
            if let Some(why) = s.pinned.or(s.singleton) {
                return Some(format!(
                    "source {source} (a {} source): {why}",
                    s.config.kind()
                ));
            }
            (s.on_error == OnError::Skip).then(|| {
                format!(
                    "source {source} has `on_error: skip`, and its dead-letter file is \
                     numbered by one shard's transactions"
                )
            })
        });
        sources.or_else(|| {
            (m.pinned.or(m.singleton))
                .map(|why| format!("its endpoint (a {} driver): {why}", m.endpoint.kind))
        })
    }

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

    /// The dead-letter files materialization `name` writes (one per path, sorted).
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
        // TLS files are read now, so a missing or wrong one fails here, named.
        let named = |prefix: &str| {
            let prefix = prefix.to_string();
            move |e: sluice_source_sdk::InvalidConfig| {
                let inner = if e.place.is_empty() {
                    "tls".into()
                } else {
                    e.place
                };
                invalid(format!("{prefix}.{inner}"), e.message)
            }
        };
        if let Some(tls) = self.runtime.metrics.as_ref().and_then(|m| m.tls.as_ref()) {
            tls.acceptor("tls").map_err(named("runtime.metrics"))?;
        }
        if let Some(tls) = self.cluster.as_ref().and_then(|c| c.tls.as_ref()) {
            tls.connector("tls").map_err(named("cluster"))?;
        }
        let timeouts = &self.runtime.timeouts;
        for (what, timeout) in [("driver", timeouts.driver), ("source", timeouts.source)] {
            if timeout.is_zero() {
                return Err(invalid(
                    format!("runtime.timeouts.{what}"),
                    "a timeout must be longer than 0, e.g. \"5m\"",
                ));
            }
        }
        if let Some(workers) = self.runtime.workers {
            if let Workers::Count(n) = workers
                && !(1..=256).contains(&n)
            {
                return Err(invalid("runtime.workers", "between 1 and 256, or `auto`"));
            }
            if self.cluster.is_some() {
                return Err(invalid(
                    "runtime.workers",
                    "a cluster's members run the shards it assigns them: remove `workers`, \
                     and set `cluster.shards` or use `sluice shards split`",
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
            if let Some(auto) = &cluster.autosplit
                && !(2..=1024).contains(&auto.max_shards)
            {
                return Err(invalid(
                    "cluster.autosplit.max_shards",
                    "between 2 and 1024",
                ));
            }
        }
        Ok(())
    }
}
