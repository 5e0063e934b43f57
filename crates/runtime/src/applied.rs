//! The applied spec of a materialization: what `sluice apply` (or the first `sluice run`)
//! last applied to its store, kept beside its recovery log, so that a store is never
//! written under a spec it was not applied with.
//!
//! ```text
//!  <recovery_log>/<materialization>/applied   {"format": 1, "version": "1a2b3c4d",
//!                                              "spec": "<hex of the protobuf MaterializationSpec>"}
//! ```
//!
//! `sluice run` reads it before anything runs ([`check`], pure): never applied → apply
//! and record (a first start); the same version → run; another version → refuse, naming
//! what changed ([`changes`]) and `sluice apply`. The version is also what Open carries,
//! and a driver refuses an Open of a version other than the one it applied.
//!
//! Each change knows where the pipeline file writes what changed ([`Written`]), so that
//! [`describe`] can say when that place took a `${VAR:-default}`'s default: a variable
//! forgotten is the usual reason a spec changes that nobody edited.
//!
//! The file is replaced atomically (written beside, fsync'ed, renamed over, directory
//! fsync'ed): a crash leaves the old record or the new one. It lives with the recovery
//! log because both describe the same store: deleting the materialization
//! (`sluice apply --delete`) removes both.
//!
//! Threads: [`read`], [`record`] and [`forget`] are async, and do their file work
//! (reads, fsyncs, renames) on a blocking task, never on the calling async worker.

use crate::config::Pipeline;
use prost::Message;
use serde::{Deserialize, Serialize};
use sluice_proto::flow;
use std::path::{Path, PathBuf};

const FILE: &str = "applied";
const FORMAT: u32 = 1;

/// A version string of a spec: changes whenever the spec does.
pub fn version(spec: &flow::MaterializationSpec) -> String {
    format!("{:08x}", crc32fast::hash(&spec.encode_to_vec()))
}

/// The spec last applied to a materialization's store.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub version: String,
    pub spec: flow::MaterializationSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppliedFile {
    format: u32,
    version: String,
    spec: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AppliedError {
    #[error("applied spec {}: cannot {action}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: std::io::Error,
    },
    /// Never guessed past: re-applying writes a good one.
    #[error("applied spec {} is unreadable: {reason}; run `sluice apply` on the \
             pipeline file to record it again", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> AppliedError {
    let path = path.to_path_buf();
    move |error| AppliedError::Io {
        path,
        action,
        error,
    }
}

/// The applied spec recorded in the recovery log directory `dir`, if any.
pub async fn read(dir: &Path) -> Result<Option<Applied>, AppliedError> {
    let dir = dir.to_path_buf();
    crate::blocking::unblock(move || read_file(&dir)).await
}

fn read_file(dir: &Path) -> Result<Option<Applied>, AppliedError> {
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, "read")(e)),
    };
    decode(&bytes)
        .map(Some)
        .map_err(|reason| AppliedError::Corrupt { path, reason })
}

/// The record of `spec` as applied, as bytes: what the file holds, and what a cluster
/// keeps in etcd.
pub fn encode(spec: &flow::MaterializationSpec) -> Vec<u8> {
    let file = AppliedFile {
        format: FORMAT,
        version: version(spec),
        spec: sluice_doc::hex::encode(&spec.encode_to_vec()),
    };
    serde_json::to_vec(&file).expect("the record serializes")
}

/// Reads bytes written by [`encode`]; the error says what is wrong with them.
pub fn decode(bytes: &[u8]) -> Result<Applied, String> {
    let file: AppliedFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.format != FORMAT {
        return Err(format!(
            "format {} (this sluice reads {FORMAT})",
            file.format
        ));
    }
    let encoded =
        sluice_doc::hex::decode(&file.spec).ok_or_else(|| "the spec is not hex".to_string())?;
    let spec = flow::MaterializationSpec::decode(encoded.as_slice())
        .map_err(|e| format!("the spec does not decode: {e}"))?;
    Ok(Applied {
        version: file.version,
        spec,
    })
}

/// Records `spec` as applied in `dir`. Returns only after the record is durable.
pub async fn record(dir: &Path, spec: &flow::MaterializationSpec) -> Result<(), AppliedError> {
    let (dir, spec) = (dir.to_path_buf(), spec.clone());
    crate::blocking::unblock(move || write_file(&dir, &spec)).await
}

fn write_file(dir: &Path, spec: &flow::MaterializationSpec) -> Result<(), AppliedError> {
    crate::blocking::replace_file(dir, FILE, &encode(spec)).map_err(|e| AppliedError::Io {
        path: e.path,
        action: e.action,
        error: e.error,
    })
}

/// Forgets the applied spec in `dir` (a deleted materialization). Durable on return.
pub async fn forget(dir: &Path) -> Result<(), AppliedError> {
    let dir = dir.to_path_buf();
    crate::blocking::unblock(move || remove_file(&dir)).await
}

fn remove_file(dir: &Path) -> Result<(), AppliedError> {
    let path = dir.join(FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(&path, "remove")(e)),
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync the directory"))
}

/// What `sluice run` does with the spec of the pipeline file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Never applied: apply it now (a first start) and record it.
    FirstApply,
    /// The applied spec is the file's: run.
    Current,
    /// The file differs from what was applied: refuse, naming the changes.
    Differs {
        applied: String,
        file: String,
        changes: Vec<Change>,
    },
}

/// One difference between the applied spec and the file's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// As shown: `endpoint.path "a" → "b"`.
    pub what: String,
    /// Where the pipeline file writes the value that changed, when one place does.
    pub written: Option<Written>,
}

/// Where in a materialization's part of the pipeline file a changed value is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The endpoint's configuration, at this dotted path in it (`path`; empty: all of it).
    Endpoint(String),
    /// The binding at this index of the file's (and the spec's) bindings.
    Binding(usize),
    /// The collection of this name (its schema or key).
    Collection(String),
}

impl Change {
    fn new(what: String, written: Option<Written>) -> Change {
        Change { what, written }
    }
}

/// The changes as one line for materialization `materialization` of `pipeline`, each
/// followed by the `${VAR:-default}`s that took their default where it is written:
/// `endpoint.path "a" → "b" (the default of ${DB_PATH:-b}: DB_PATH is not set)`.
pub fn describe(changes: &[Change], pipeline: &Pipeline, materialization: &str) -> String {
    let place = |written: &Written| {
        let m = format!("materializations.{materialization}");
        match written {
            Written::Endpoint(path) => {
                let kind = pipeline
                    .materializations
                    .get(materialization)
                    .map_or("", |def| def.endpoint.kind.as_str());
                match path.as_str() {
                    "" => format!("{m}.endpoint.{kind}"),
                    path => format!("{m}.endpoint.{kind}.{path}"),
                }
            }
            Written::Binding(i) => format!("{m}.bindings[{i}]"),
            Written::Collection(name) => format!("collections.{name}"),
        }
    };
    let described = changes.iter().map(|change| {
        let defaults: Vec<String> = match &change.written {
            Some(written) => {
                let place = place(written);
                (pipeline.defaulted.iter())
                    .filter(|d| d.within(&place))
                    .map(|d| d.explain())
                    .collect()
            }
            None => Vec::new(),
        };
        match defaults.is_empty() {
            true => change.what.clone(),
            false => format!("{} ({})", change.what, defaults.join(", ")),
        }
    });
    described.collect::<Vec<_>>().join("; ")
}

/// Decides, from the recorded applied spec, whether `planned` may run.
pub fn check(applied: Option<&Applied>, planned: &flow::MaterializationSpec) -> Check {
    let file = version(planned);
    match applied {
        None => Check::FirstApply,
        Some(applied) if applied.version == file && applied.spec == *planned => Check::Current,
        Some(applied) => Check::Differs {
            applied: applied.version.clone(),
            file,
            changes: changes(&applied.spec, planned),
        },
    }
}

/// What differs between the applied spec and the planned one, one phrase per change:
/// the endpoint, bindings added or removed (by resource path), and per binding its
/// collection, resource, delta updates, selected fields and collection spec.
pub fn changes(
    applied: &flow::MaterializationSpec,
    planned: &flow::MaterializationSpec,
) -> Vec<Change> {
    let mut out = Vec::new();
    if applied.endpoint_type != planned.endpoint_type {
        out.push(Change::new("the endpoint's kind changed".to_string(), None));
    } else if applied.endpoint_spec_json != planned.endpoint_spec_json {
        let parsed = |json: &str| serde_json::from_str::<serde_json::Value>(json).ok();
        let mut values = Vec::new();
        if let (Some(old), Some(new)) = (
            parsed(&applied.endpoint_spec_json),
            parsed(&planned.endpoint_spec_json),
        ) {
            value_changes("", &old, &new, &mut values);
        }
        if values.is_empty() {
            values.push(Change::new(
                "the endpoint configuration changed".to_string(),
                Some(Written::Endpoint(String::new())),
            ));
        }
        out.extend(values);
    }
    let name = |b: &flow::materialization_spec::Binding| b.resource_path.join(".");
    let find = |bindings: &[flow::materialization_spec::Binding], resource: &str| {
        bindings.iter().position(|b| name(b) == resource)
    };
    for old in &applied.bindings {
        if find(&planned.bindings, &name(old)).is_none() {
            out.push(Change::new(
                format!("binding {} was removed", name(old)),
                None,
            ));
        }
    }
    for (i, new) in planned.bindings.iter().enumerate() {
        let resource = name(new);
        let Some(j) = find(&applied.bindings, &resource) else {
            out.push(Change::new(
                format!("binding {resource} was added"),
                Some(Written::Binding(i)),
            ));
            continue;
        };
        let old = &applied.bindings[j];
        if i != j {
            out.push(Change::new(
                format!("binding {resource} moved from place {j} to {i}"),
                None,
            ));
        }
        binding_changes((i, &resource), old, new, &mut out);
    }
    if out.is_empty() && applied != planned {
        out.push(Change::new("the spec changed".to_string(), None));
    }
    out
}

/// Each leaf of the endpoint configurations `old` and `new` that differs, as
/// `endpoint.<path> <old> → <new>` (`path` is dotted from `at`), so that a value that
/// changed under the file (an environment variable unset or different) shows what it
/// was and what it is now.
fn value_changes(
    at: &str,
    old: &serde_json::Value,
    new: &serde_json::Value,
    out: &mut Vec<Change>,
) {
    use serde_json::Value;
    let change = |path: &str, what: String| {
        let shown = match path {
            "" => format!("endpoint {what}"),
            path => format!("endpoint.{path} {what}"),
        };
        Change::new(shown, Some(Written::Endpoint(path.to_string())))
    };
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for key in keys {
                let path = match at {
                    "" => key.clone(),
                    at => format!("{at}.{key}"),
                };
                match (old.get(key), new.get(key)) {
                    (Some(old), Some(new)) => value_changes(&path, old, new, out),
                    (Some(old), None) => out.push(change(&path, format!("{old} → unset"))),
                    (None, Some(new)) => out.push(change(&path, format!("unset → {new}"))),
                    (None, None) => {}
                }
            }
        }
        (old, new) if old != new => out.push(change(at, format!("{old} → {new}"))),
        _ => {}
    }
}

fn binding_changes(
    (index, resource): (usize, &str),
    old: &flow::materialization_spec::Binding,
    new: &flow::materialization_spec::Binding,
    out: &mut Vec<Change>,
) {
    let (old_c, new_c) = (
        old.collection.clone().unwrap_or_default(),
        new.collection.clone().unwrap_or_default(),
    );
    // Where each change is written: the binding, or the collection's own spec.
    let mut written_in = |written: Written, what: String| {
        out.push(Change::new(
            format!("binding {resource}: {what}"),
            Some(written),
        ))
    };
    if old_c.collection != new_c.collection {
        written_in(
            Written::Binding(index),
            format!("collection {} → {}", old_c.collection, new_c.collection),
        );
    } else if old_c != new_c {
        written_in(
            Written::Collection(new_c.collection.clone()),
            format!(
                "the spec of collection {} (schema, key or projections)",
                new_c.collection
            ),
        );
    }
    let mut change = |what: String| written_in(Written::Binding(index), what);
    if old.resource_spec_json != new.resource_spec_json {
        change(format!(
            "resource {} → {}",
            old.resource_spec_json, new.resource_spec_json
        ));
    }
    if old.backfill != new.backfill {
        change(format!(
            "backfill {} → {} (`sluice apply` rebuilds the binding: its resource dropped \
             and recreated, its sources read again from the beginning)",
            old.backfill, new.backfill
        ));
    }
    if old.delta_updates != new.delta_updates {
        change(format!(
            "delta updates {} → {}",
            old.delta_updates, new.delta_updates
        ));
    }
    let (old_f, new_f) = (
        old.field_selection.clone().unwrap_or_default(),
        new.field_selection.clone().unwrap_or_default(),
    );
    let list = |fields: &[String]| format!("[{}]", fields.join(", "));
    for (what, before, after) in [
        ("keys", &old_f.keys, &new_f.keys),
        ("values", &old_f.values, &new_f.values),
    ] {
        if before != after {
            change(format!("{what} {} → {}", list(before), list(after)));
        }
    }
    if old_f.document != new_f.document {
        let shown = |d: &str| {
            if d.is_empty() {
                "none".to_string()
            } else {
                d.to_string()
            }
        };
        change(format!(
            "document field {} → {}",
            shown(&old_f.document),
            shown(&new_f.document)
        ));
    }
    if old_f.field_config_json != new_f.field_config_json {
        change("field configuration".to_string());
    }
}

/// The bindings of `next` to rebuild: each whose backfill counter rose against the
/// binding of the same resource path in `last` (the spec applied last). A binding new
/// to the spec is created, not rebuilt.
pub fn rebuilt(last: &flow::MaterializationSpec, next: &flow::MaterializationSpec) -> Vec<usize> {
    (next.bindings.iter().enumerate())
        .filter(|(_, b)| {
            (last.bindings.iter())
                .find(|l| l.resource_path == b.resource_path)
                .is_some_and(|l| b.backfill > l.backfill)
        })
        .map(|(i, _)| i)
        .collect()
}

/// Refuses a backfill (a binding of `next` rebuilt against `last`) that would reduce
/// documents twice: of a standard binding when the driver does not empty what it stored
/// (`driver_rebuilds`: [`sluice_driver_sdk::Declared::rebuilds_on_backfill`]), or whose
/// collection's sources also feed a binding of `next` that is not rebuilt. Names the
/// bindings, and the source.
pub fn check_backfills(
    pipeline: &Pipeline,
    last: Option<&flow::MaterializationSpec>,
    next: &flow::MaterializationSpec,
    driver_rebuilds: bool,
) -> Result<(), String> {
    let Some(last) = last else {
        return Ok(());
    };
    let rebuilt = rebuilt(last, next);
    let kept = (rebuilt.iter().map(|&i| &next.bindings[i])).find(|b| !b.delta_updates);
    if let (false, Some(binding)) = (driver_rebuilds, kept) {
        return Err(format!(
            "binding {}: its backfill counter rose, so its input is read again from the \
             start, but this endpoint's driver does not empty what the binding stored \
             (only the SQL stores do, and drivers speaking Flow's current protocol: \
             `protocol: current`), so every reduction would count twice; empty it \
             yourself with `sluice apply --delete` and start over, or put the counter back",
            binding.resource_path.join(".")
        ));
    }
    let collection = |b: &flow::materialization_spec::Binding| {
        b.collection
            .as_ref()
            .map(|c| c.collection.clone())
            .unwrap_or_default()
    };
    for &i in &rebuilt {
        let back = &next.bindings[i];
        let other = (next.bindings.iter().enumerate())
            .find(|(j, b)| !rebuilt.contains(j) && collection(b) == collection(back));
        let Some((_, other)) = other else {
            continue;
        };
        let source = (pipeline.sources.iter())
            .find(|(_, def)| def.target == collection(back))
            .map_or_else(
                || format!("of collection {}", collection(back)),
                |(n, _)| n.clone(),
            );
        return Err(crate::txn::shared_source(
            &source,
            &back.resource_path.join("."),
            &other.resource_path.join("."),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flow::materialization_spec::Binding;

    fn binding(table: &str, collection: &str, values: &[&str]) -> Binding {
        Binding {
            resource_spec_json: format!(r#"{{"table":"{table}"}}"#),
            resource_path: vec![table.to_string()],
            collection: Some(flow::CollectionSpec {
                collection: collection.to_string(),
                key_ptrs: vec!["/id".to_string()],
                ..Default::default()
            }),
            field_selection: Some(flow::FieldSelection {
                keys: vec!["id".to_string()],
                values: values.iter().map(|v| v.to_string()).collect(),
                document: "flow_document".to_string(),
                ..Default::default()
            }),
            delta_updates: false,
            backfill: 0,
        }
    }

    fn spec(bindings: Vec<Binding>) -> flow::MaterializationSpec {
        flow::MaterializationSpec {
            materialization: "views-db".to_string(),
            endpoint_type: 2,
            endpoint_spec_json: r#"{"path":"out.db"}"#.to_string(),
            bindings,
        }
    }

    #[test]
    fn changes_name_the_binding_and_what_changed() {
        let base = || spec(vec![binding("t", "acme/views", &["n"])]);
        let cases: Vec<(&str, flow::MaterializationSpec, &[&str])> = vec![
            ("the same spec", base(), &[]),
            (
                "a value field selected",
                spec(vec![binding("t", "acme/views", &["last", "n"])]),
                &["binding t: values [n] → [last, n]"],
            ),
            (
                "a binding added",
                spec(vec![
                    binding("t", "acme/views", &["n"]),
                    binding("u", "acme/users", &[]),
                ]),
                &["binding u was added"],
            ),
            (
                "a binding renamed",
                spec(vec![binding("t2", "acme/views", &["n"])]),
                &["binding t was removed", "binding t2 was added"],
            ),
            (
                "another collection",
                spec(vec![binding("t", "acme/other", &["n"])]),
                &["binding t: collection acme/views → acme/other"],
            ),
            (
                "a backfill",
                {
                    let mut s = base();
                    s.bindings[0].backfill = 1;
                    s
                },
                &[
                    "binding t: backfill 0 → 1 (`sluice apply` rebuilds the binding: its \
                   resource dropped and recreated, its sources read again from the \
                   beginning)",
                ],
            ),
            (
                "delta updates",
                {
                    let mut s = base();
                    s.bindings[0].delta_updates = true;
                    s
                },
                &["binding t: delta updates false → true"],
            ),
            (
                "the schema",
                {
                    let mut s = base();
                    s.bindings[0].collection.as_mut().unwrap().schema_json = "{}".into();
                    s
                },
                &["binding t: the spec of collection acme/views (schema, key or projections)"],
            ),
            (
                "the endpoint",
                {
                    let mut s = base();
                    s.endpoint_spec_json = r#"{"path":"other.db","wal":true}"#.into();
                    s
                },
                &[
                    r#"endpoint.path "out.db" → "other.db""#,
                    "endpoint.wal unset → true",
                ],
            ),
            (
                "the endpoint's kind",
                {
                    let mut s = base();
                    s.endpoint_type = 3;
                    s
                },
                &["the endpoint's kind changed"],
            ),
            (
                "anything else",
                {
                    let mut s = base();
                    s.materialization = "renamed".into();
                    s
                },
                &["the spec changed"],
            ),
        ];
        for (case, planned, want) in cases {
            let got: Vec<String> = changes(&base(), &planned)
                .into_iter()
                .map(|c| c.what)
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn run_applies_first_runs_when_current_and_refuses_a_difference() {
        let applied = spec(vec![binding("t", "acme/views", &["n"])]);
        let planned = spec(vec![binding("t", "acme/views", &["last", "n"])]);
        let record = Applied {
            version: version(&applied),
            spec: applied.clone(),
        };
        assert_eq!(check(None, &planned), Check::FirstApply);
        assert_eq!(check(Some(&record), &applied), Check::Current);
        assert_eq!(
            check(Some(&record), &planned),
            Check::Differs {
                applied: version(&applied),
                file: version(&planned),
                changes: vec![Change {
                    what: "binding t: values [n] → [last, n]".to_string(),
                    written: Some(Written::Binding(0)),
                }],
            }
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_record_round_trips_and_damage_is_an_error_naming_sluice_apply() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).await.unwrap(), None);
        let s = spec(vec![binding("t", "acme/views", &["n"])]);
        record(dir.path(), &s).await.unwrap();
        let applied = read(dir.path()).await.unwrap().unwrap();
        assert_eq!(
            applied,
            Applied {
                version: version(&s),
                spec: s
            }
        );
        std::fs::write(
            dir.path().join(FILE),
            b"{\"format\":1,\"version\":\"x\",\"spec\":\"zz\"}",
        )
        .unwrap();
        let err = read(dir.path()).await.unwrap_err().to_string();
        assert!(
            err.contains("the spec is not hex") && err.contains("sluice apply"),
            "{err}"
        );
    }
}
