//! What the two protocols share: the messages a source acts on, the catalog a
//! connector discovers, and the [`Protocol`] each of `airbyte.rs` and `singer.rs`
//! implements (pure: parsing lines, folding states, writing catalogs and arguments).
//!
//! A record's document is handed on as the JSON text the connector wrote
//! ([`RawValue`], borrowed from the line): the runtime parses it, once.

use crate::config::{StreamSelect, SyncMode, pointer_segments};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::ffi::OsString;
use std::path::Path;

/// A line of a connector's output, as far as the source cares.
#[derive(Debug)]
pub enum Message<'a> {
    /// A document of `stream`, its text as written.
    Record {
        stream: Cow<'a, str>,
        data: &'a RawValue,
    },
    /// A checkpoint: the protocol's state message, folded by [`Protocol::absorb`].
    State(Value),
    /// A log line of the connector; `error` when its level is ERROR or FATAL.
    Log { error: bool, message: String },
    /// The connector failed; `config`: because of its configuration (not retried).
    Error { message: String, config: bool },
    /// How many records `stream` will send in all (Airbyte's estimate trace).
    Estimate { stream: String, rows: u64 },
    /// The catalog `discover` answers.
    Catalog(Value),
    /// `check`'s answer: `Ok` or the connector's reason.
    Status(Result<(), String>),
    /// Anything else (a spec, a stream status, a schema message): nothing to do.
    Other,
}

/// A stream a connector offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub name: String,
    /// Its JSON schema, as the connector reports it.
    pub schema: Value,
    /// Its primary key as JSON pointers (`/id`); empty when the connector has none.
    pub key: Vec<String>,
    /// Airbyte: whether it can be read incrementally.
    pub incremental: bool,
    /// The connector's own description of the stream, for the catalog it is given back.
    pub raw: Value,
}

/// One of the two protocols.
pub trait Protocol: Send + Sync + 'static {
    /// The source kind's key in the pipeline file (`airbyte`).
    const NAME: &'static str;
    /// The prefix of a connector's program (`source-faker`, `tap-jsonl`).
    const PREFIX: &'static str;
    /// The state folded from the connector's state messages so far.
    type State: Send + 'static;

    /// Parses one line of output; `Err` for a line that is not a message.
    fn parse(line: &[u8]) -> Result<Message<'_>, serde_json::Error>;

    /// The state a resume position holds (the content of the state file; null: none).
    fn state_from(file: &Value) -> Result<Self::State, String>;
    /// Folds a state message in; returns the state to resume from after it (what the
    /// state file holds).
    fn absorb(state: &mut Self::State, message: Value) -> Result<Value, String>;
    /// Whether there is a state to hand the connector.
    fn has_state(state: &Self::State) -> bool;
    /// The state file's content.
    fn file(state: &Self::State) -> Value;

    /// The streams of a `discover` run's whole output.
    fn catalog(output: &[u8]) -> Result<Vec<Stream>, String>;
    /// The catalog a `read` is given: the `selected` streams of `offered`.
    fn configured(offered: &[Stream], selected: &[StreamSelect]) -> Result<Value, String>;

    /// The arguments of `spec`; `None` where the protocol has none.
    fn spec_args() -> Option<Vec<OsString>>;
    /// The defaults the spec's output declares for top-level configuration keys.
    fn defaults(spec: &[u8]) -> Map<String, Value>;
    /// The arguments of `discover`.
    fn discover_args(config: &Path) -> Vec<OsString>;
    /// The arguments of `check`; `None` where the protocol has none (discover then
    /// checks the configuration).
    fn check_args(config: &Path) -> Option<Vec<OsString>>;
    /// The arguments of `read`.
    fn read_args(config: &Path, catalog: &Path, state: Option<&Path>) -> Vec<OsString>;
}

/// The offered stream each selected one names, in selection order; an unknown name is
/// an error listing what the connector offers.
pub fn select<'s>(
    offered: &'s [Stream],
    selected: &'s [StreamSelect],
) -> Result<Vec<(&'s Stream, &'s StreamSelect)>, String> {
    selected
        .iter()
        .map(|select| {
            offered
                .iter()
                .find(|s| s.name == select.name)
                .map(|s| (s, select))
                .ok_or_else(|| {
                    let names: Vec<&str> = offered.iter().map(|s| s.name.as_str()).collect();
                    format!(
                        "the connector has no stream {:?} (it offers: {})",
                        select.name,
                        names.join(", ")
                    )
                })
        })
        .collect()
}

/// The key a selected stream is read with: the pipeline's, else the connector's.
pub fn key_of(stream: &Stream, select: &StreamSelect) -> Vec<String> {
    select.key.clone().unwrap_or_else(|| stream.key.clone())
}

/// The sync mode a selected Airbyte stream is read with: the pipeline's, else
/// incremental where the stream offers it.
pub fn mode_of(stream: &Stream, select: &StreamSelect) -> SyncMode {
    select.sync_mode.unwrap_or(if stream.incremental {
        SyncMode::Incremental
    } else {
        SyncMode::FullRefresh
    })
}

/// A key's pointers as paths of property names (`/a/b` → `["a", "b"]`).
pub fn key_paths(key: &[String]) -> Vec<Vec<String>> {
    key.iter().map(|p| pointer_segments(p)).collect()
}

/// A path of property names as a JSON pointer (`["a/b"]` → `/a~1b`).
pub fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// Arguments from strings and paths.
pub fn args<const N: usize>(parts: [&dyn AsRef<std::ffi::OsStr>; N]) -> Vec<OsString> {
    parts.iter().map(|p| p.as_ref().to_os_string()).collect()
}
