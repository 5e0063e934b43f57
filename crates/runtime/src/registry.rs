//! The kinds of source and driver a binary knows: the runtime reads a pipeline file and
//! connects its endpoints only through this registry, never by naming a connector.
//!
//! ```text
//!  sources.<name>:              {target, on_error?, dead_letter?, <source kind>: {...}}
//!  materializations.<name>:     {endpoint: {<driver kind>: {...}}, bindings, shard?}
//!                                            │
//!  Registry { sources: [Kind…], drivers: [DriverKind…] }   (filled by the binary, one line a kind)
//!      source kind ──parse──▶ SourceConfig ──open──▶ Box<dyn Source>
//!      driver kind ──parse──▶ endpoint config (JSON) ──connect──▶ Connected endpoint
//! ```
//!
//! A new source is a crate implementing `sluice_source_sdk::SourceKind` plus one
//! `with_source` line in the binary. A driver built into the binary is one `with_builtin`
//! line whatever its family (`sluice_driver_sdk::BuiltinKind`): a Flow driver
//! (`Builtin::new…`, naming its crate's endpoint configuration type and constructor), an
//! epoch sink (a `SinkKind`) or an output (an `OutputKind`). All three run on the
//! in-process transport, and reach the recovery log only by the transactor's calls beside
//! the protocol. Drivers outside the binary are reached by the [`Grpc`] and [`Command`]
//! kinds.
//!
//! What holds:
//! - Names are unique: registering a kind twice is a bug of the binary, and panics.
//! - After a kind's `parse` returns, its configuration is checked and complete:
//!   relative paths are relative to the pipeline file's folder, defaults are filled.
//! - A built-in driver's endpoint configuration is checked at parse time by the very
//!   type the driver parses it with, so the pipeline file accepts exactly what the
//!   driver does; the JSON sent to the driver is what the user wrote, with paths
//!   resolved.

use crate::admission::{DeclaredPattern, SinkGuarantee};
use crate::types::EndpointDef;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_driver_sdk::contract::Placement;
use sluice_driver_sdk::current::{self, Codec, Protocol};
use sluice_driver_sdk::flow::EndpointType;
use sluice_driver_sdk::grpc::channel_uri;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::{BuiltinKind, CommitPattern, Driver, Endpoint};
use sluice_source_sdk::config::{parse, resolve_path};
use sluice_source_sdk::{InvalidConfig, Kind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A kind of endpoint: its key in a pipeline file, its configuration, how to connect it.
#[async_trait]
pub trait DriverKind: Send + Sync {
    /// The key naming this kind in an endpoint of the pipeline file (`sqlite`).
    fn name(&self) -> &'static str;

    /// Checks the configuration written under this kind's key and returns it complete
    /// (relative paths relative to `base_dir`). Errors name their place inside it.
    fn parse(&self, config: Value, base_dir: &Path) -> Result<Value, InvalidConfig>;

    /// Connects materialization `materialization`'s endpoint, configured by what
    /// [`DriverKind::parse`] returned; `state_dir` is where it may keep state.
    async fn connect(
        &self,
        materialization: &str,
        state_dir: &Path,
        config: &Value,
    ) -> Result<Connected, String>;

    /// Why an endpoint of this kind, configured by what [`DriverKind::parse`] returned,
    /// cannot run in a cluster, whose shards move between members: state kept beside the
    /// local recovery log, or a store that cannot fence a former holder
    /// ([`UNFENCED`]); `None`: it can.
    fn pinned(&self, _config: &Value) -> Option<&'static str> {
        None
    }

    /// Why an endpoint of this kind, configured by what [`DriverKind::parse`] returned,
    /// takes one writer at a time (its sink contract's placement is singleton), so its
    /// materialization runs as one shard, never split; `None`: several may write.
    fn singleton(&self, _config: &Value) -> Option<&'static str> {
        None
    }

    /// A fresh instance of the driver, when it is built into the binary (what `sluice
    /// driver serve` serves).
    fn driver(&self) -> Option<Arc<dyn Driver>> {
        None
    }

    /// The JSON schemas of this kind's endpoint configuration and of its bindings'
    /// resources (what `sluice schema` prints): a built-in driver's Spec.
    async fn schemas(&self) -> Result<Schemas, String> {
        let driver = self
            .driver()
            .ok_or_else(|| format!("the `{}` endpoint declares no schema", self.name()))?;
        Schemas::of_spec(driver.as_ref()).await
    }
}

/// A connected endpoint and what to tell it about itself.
pub struct Connected {
    pub endpoint: Arc<dyn Endpoint>,
    pub endpoint_type: EndpointType,
    /// The endpoint configuration JSON sent in requests.
    pub config: Value,
    /// What the endpoint declares it gives (admission).
    pub guarantee: SinkGuarantee,
    /// The longest one call of it may take, as its kind says
    /// ([`BuiltinKind::longest_call`]): the runtime's waits on it outlast that.
    pub longest_call: Option<Duration>,
    /// Its Apply empties a standard binding whose backfill counter rose
    /// ([`sluice_driver_sdk::Declared::rebuilds_on_backfill`]); an external driver only
    /// when it is configured to speak Flow's current protocol, whose connectors must.
    pub rebuilds_on_backfill: bool,
}

impl Connected {
    /// A Flow driver declaring `pattern` (`None`: undeclared).
    pub fn flow(
        endpoint: Arc<dyn Endpoint>,
        endpoint_type: EndpointType,
        config: Value,
        pattern: Option<CommitPattern>,
    ) -> Connected {
        Connected {
            endpoint,
            endpoint_type,
            config,
            guarantee: SinkGuarantee::Flow(pattern),
            longest_call: None,
            rebuilds_on_backfill: false,
        }
    }

    /// An external driver configured to speak `protocol`.
    fn speaking(self, protocol: Option<Protocol>) -> Connected {
        Connected {
            rebuilds_on_backfill: protocol == Some(Protocol::Current),
            ..self
        }
    }
}

/// Connects the endpoints a pipeline names: the [`Registry`] of the binary's driver
/// kinds, or a stand-in of a test or bench.
#[async_trait]
pub trait Connect: Send + Sync {
    /// Connects materialization `materialization`'s endpoint; `state_dir` is a folder
    /// beside its recovery log that the endpoint may keep state in.
    async fn connect(
        &self,
        materialization: &str,
        state_dir: &Path,
        endpoint: &EndpointDef,
    ) -> Result<Connected, String>;
}

/// An endpoint kind's JSON schemas: of its configuration, and of a binding's resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Schemas {
    pub endpoint: Value,
    pub resource: Value,
}

impl Schemas {
    /// What a driver's Spec says.
    async fn of_spec(driver: &dyn Driver) -> Result<Schemas, String> {
        let spec = driver
            .spec(Default::default())
            .await
            .map_err(|e| e.to_string())?;
        Schemas::parse(
            &spec.endpoint_spec_schema_json,
            &spec.resource_spec_schema_json,
        )
    }

    fn parse(endpoint: &str, resource: &str) -> Result<Schemas, String> {
        let parse = |what: &str, text: &str| {
            serde_json::from_str(text).map_err(|e| format!("the {what} schema is not JSON: {e}"))
        };
        Ok(Schemas {
            endpoint: parse("endpoint", endpoint)?,
            resource: parse("resource", resource)?,
        })
    }
}

/// What an external driver's binding resource is: whatever that driver's Spec says.
const EXTERNAL_RESOURCE_SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "The driver's resource",
  "type": "object",
  "description": "As the driver's own Spec defines it."
}"#;

/// The endpoint schema of an external driver kind: `title`, its `required` key, its own
/// `properties` (JSON members), and the `config`, `pattern` and `protocol` keys both
/// kinds take.
fn external_endpoint_schema(title: &str, required: &str, properties: &str) -> String {
    format!(
        r#"{{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "{title}",
  "type": "object",
  "required": ["{required}"],
  "additionalProperties": false,
  "properties": {{
    {properties},
    "config": {{"type": "object", "default": {{}}, "description": "The endpoint configuration sent to the driver."}},
    "pattern": {{"type": "string", "enum": ["authoritative", "idempotent_apply", "non_transactional"], "description": "How the driver commits, as its author declares (undeclared: non-transactional; admission reads it)."}},
    "protocol": {{"type": "string", "enum": ["current", "transactions"], "description": "The protocol the driver speaks: Flow's current one (materialize.Connector/Materialize) or the seed's Transactions. Unset: asked of the driver once, by a Spec request, before the first call."}}
  }}
}}"#
    )
}

/// Why a non-transactional store cannot run under a cluster: nothing in it fences a
/// former holder (a member stopped past its lease, a zombie), whose write arriving late
/// overwrites what the new holder stored since.
pub const UNFENCED: &str = "a non-transactional store cannot fence a former holder (a \
    member stopped past its lease), so that holder's late write can land after the new \
    holder's and roll a reduced value back";

/// [`UNFENCED`], for an external driver that declares no commit pattern.
pub const UNFENCED_UNDECLARED: &str = "a driver of undeclared commit pattern counts as \
    non-transactional, and a non-transactional store cannot fence a former holder (a member \
    stopped past its lease), so that holder's late write can land after the new holder's \
    and roll a reduced value back; declare `pattern: authoritative` if the driver fences \
    older holders at Open";

/// Why an external driver declaring `pattern` cannot run under a cluster.
fn declared_pinned(pattern: Option<DeclaredPattern>) -> Option<&'static str> {
    match pattern {
        None => Some(UNFENCED_UNDECLARED),
        Some(DeclaredPattern::NonTransactional) => Some(UNFENCED),
        Some(DeclaredPattern::Authoritative | DeclaredPattern::IdempotentApply) => None,
    }
}

/// The source and driver kinds a binary knows.
#[derive(Default)]
pub struct Registry {
    sources: Vec<Kind>,
    drivers: Vec<Box<dyn DriverKind>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a source kind (`sluice_source_sdk::kind::<K>()`).
    pub fn with_source(mut self, kind: Kind) -> Registry {
        assert!(
            self.source(kind.name()).is_none(),
            "source kind {:?} registered twice",
            kind.name()
        );
        self.sources.push(kind);
        self
    }

    /// Adds a kind of driver built into the binary, run in process.
    pub fn with_builtin(self, kind: impl BuiltinKind) -> Registry {
        self.with_driver(InProcessKind(Box::new(kind)))
    }

    /// Adds a driver kind.
    pub fn with_driver(mut self, kind: impl DriverKind + 'static) -> Registry {
        assert!(
            self.driver(kind.name()).is_none(),
            "driver kind {:?} registered twice",
            kind.name()
        );
        self.drivers.push(Box::new(kind));
        self
    }

    pub fn source(&self, name: &str) -> Option<&Kind> {
        self.sources.iter().find(|k| k.name() == name)
    }

    pub fn driver(&self, name: &str) -> Option<&dyn DriverKind> {
        self.drivers.iter().find(|k| k.name() == name).map(|k| &**k)
    }

    /// The source kinds' names, sorted.
    pub fn source_names(&self) -> Vec<&'static str> {
        sorted(self.sources.iter().map(Kind::name))
    }

    /// The driver kinds' names, sorted.
    pub fn driver_names(&self) -> Vec<&'static str> {
        sorted(self.drivers.iter().map(|k| k.name()))
    }

    /// The names of the drivers built into the binary, sorted.
    pub fn builtin_driver_names(&self) -> Vec<&'static str> {
        sorted(
            self.drivers
                .iter()
                .filter(|k| k.driver().is_some())
                .map(|k| k.name()),
        )
    }
}

fn sorted(names: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
    let mut names: Vec<_> = names.collect();
    names.sort_unstable();
    names
}

#[async_trait]
impl Connect for Registry {
    async fn connect(
        &self,
        materialization: &str,
        state_dir: &Path,
        endpoint: &EndpointDef,
    ) -> Result<Connected, String> {
        let kind = self
            .driver(&endpoint.kind)
            .ok_or_else(|| format!("no driver kind {:?} in this binary", endpoint.kind))?;
        kind.connect(materialization, state_dir, &endpoint.config)
            .await
    }
}

/// Makes the values of `paths` relative to `base_dir`: keys of `config`, dotted for a
/// key inside an object (`tls.ca`); a key that is absent is skipped.
fn resolve_paths(config: &mut Value, paths: &[&str], base_dir: &Path) {
    for key in paths {
        let pointer = format!("/{}", key.replace('.', "/"));
        if let Some(Value::String(text)) = config.pointer_mut(&pointer) {
            let mut path = PathBuf::from(&*text);
            resolve_path(&mut path, base_dir);
            *text = path.to_string_lossy().into_owned();
        }
    }
}

/// A driver kind built into the binary, run in process: a Flow driver, an epoch sink and
/// an output alike. Admission reads an epoch sink's contract, else the commit pattern
/// the driver declares.
struct InProcessKind(Box<dyn BuiltinKind>);

impl InProcessKind {
    fn pattern(&self) -> Option<CommitPattern> {
        Some(self.0.driver(None)?.declared().pattern)
    }
}

#[async_trait]
impl DriverKind for InProcessKind {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn parse(&self, mut config: Value, base_dir: &Path) -> Result<Value, InvalidConfig> {
        resolve_paths(&mut config, self.0.paths(), base_dir);
        self.0.check(&config)?;
        Ok(config)
    }

    async fn connect(
        &self,
        _materialization: &str,
        state_dir: &Path,
        config: &Value,
    ) -> Result<Connected, String> {
        let name = self.0.name();
        let driver = (self.0.driver(Some(state_dir)))
            .ok_or_else(|| format!("the built-in driver {name} made no instance"))?;
        let declared = driver.declared();
        let guarantee = match self.0.contract(config)? {
            Some(contract) => SinkGuarantee::Epoch(contract),
            None => SinkGuarantee::Flow(Some(declared.pattern)),
        };
        Ok(Connected {
            endpoint: Arc::new(InProcess::new(name, driver)),
            endpoint_type: self.0.endpoint_type(),
            config: config.clone(),
            guarantee,
            longest_call: self.0.longest_call(config),
            rebuilds_on_backfill: declared.rebuilds_on_backfill,
        })
    }

    fn driver(&self) -> Option<Arc<dyn Driver>> {
        self.0.driver(None)
    }

    fn singleton(&self, config: &Value) -> Option<&'static str> {
        let contract = self.0.contract(config).ok().flatten();
        let by_contract = contract.is_some_and(|c| c.placement == Placement::Singleton);
        (by_contract)
            .then_some("its contract declares one writer at a time (placement: singleton)")
            .or_else(|| self.0.singleton(config))
    }

    fn pinned(&self, config: &Value) -> Option<&'static str> {
        self.0.pinned(config).or_else(|| {
            let unfenced = self.pattern() == Some(CommitPattern::RecoveryLogNonTransactional);
            unfenced.then_some(UNFENCED)
        })
    }

    async fn schemas(&self) -> Result<Schemas, String> {
        match (self.0.schemas(), self.0.driver(None)) {
            (Some((endpoint, resource)), _) => Schemas::parse(&endpoint, &resource),
            (None, Some(driver)) => Schemas::of_spec(driver.as_ref()).await,
            (None, None) => Err(format!("the `{}` endpoint declares no schema", self.name())),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// A driver served over gRPC: `grpc: {address, config?, pattern?, protocol?}`, the
/// address as `grpc://HOST:PORT`, `HOST:PORT` or `unix:/path` (checked at parse time),
/// speaking `protocol` (unset: detected before the first call).
pub struct Grpc;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcConfig {
    address: String,
    /// The endpoint configuration sent to the driver.
    #[serde(default = "empty_object")]
    config: Value,
    /// How the driver commits, as its author says (undeclared: non-transactional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pattern: Option<DeclaredPattern>,
    /// The protocol the driver speaks (unset: asked of it before the first call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    protocol: Option<Protocol>,
}

#[async_trait]
impl DriverKind for Grpc {
    fn name(&self) -> &'static str {
        "grpc"
    }

    async fn schemas(&self) -> Result<Schemas, String> {
        let endpoint = external_endpoint_schema(
            "A driver served over gRPC",
            "address",
            r#""address": {"type": "string", "minLength": 1, "description": "HOST:PORT, grpc://HOST:PORT or unix:/path."}"#,
        );
        Schemas::parse(&endpoint, EXTERNAL_RESOURCE_SCHEMA)
    }

    fn parse(&self, config: Value, _base_dir: &Path) -> Result<Value, InvalidConfig> {
        let config: GrpcConfig = parse(config)?;
        channel_uri(&config.address).map_err(|message| InvalidConfig::new("address", message))?;
        Ok(serde_json::to_value(config).expect("a gRPC endpoint serializes"))
    }

    async fn connect(
        &self,
        _materialization: &str,
        _state_dir: &Path,
        config: &Value,
    ) -> Result<Connected, String> {
        let GrpcConfig {
            address,
            config,
            pattern,
            protocol,
        } = serde_json::from_value(config.clone()).map_err(|e| e.to_string())?;
        let endpoint = current::grpc::connect(&address, protocol)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Connected::flow(
            endpoint,
            EndpointType::SluiceGrpc,
            config,
            pattern.map(Into::into),
        )
        .speaking(protocol))
    }

    fn pinned(&self, config: &Value) -> Option<&'static str> {
        // `parse` returned this configuration, so it reads; were it not to, the
        // pattern is undeclared.
        let pattern = serde_json::from_value::<GrpcConfig>(config.clone()).ok();
        declared_pinned(pattern.and_then(|c| c.pattern))
    }
}

/// A driver run as a child process speaking the stdio protocol:
/// `command: {program, args?, config?, pattern?, protocol?, codec?}`: the seed's
/// (`PROGRAM ARGS... <sub-command>`, protobuf frames) or the current one (`PROGRAM
/// ARGS...`, in `codec`), unset: detected before the first call.
pub struct Command;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandConfig {
    /// A bare name is looked up in `PATH`; one with a `/` is a file, relative to the
    /// pipeline file's folder.
    program: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    /// The endpoint configuration sent to the driver.
    #[serde(default = "empty_object")]
    config: Value,
    /// How the driver commits, as its author says (undeclared: non-transactional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pattern: Option<DeclaredPattern>,
    /// The protocol the driver speaks (unset: asked of it before the first call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    protocol: Option<Protocol>,
    /// How a current-protocol driver writes its messages (unset: `proto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    codec: Option<Codec>,
}

#[async_trait]
impl DriverKind for Command {
    fn name(&self) -> &'static str {
        "command"
    }

    async fn schemas(&self) -> Result<Schemas, String> {
        let endpoint = external_endpoint_schema(
            "A driver run as a child process speaking the stdio protocol",
            "program",
            r#""program": {"type": "string", "minLength": 1, "description": "A bare name is looked up in PATH; one with a / is a file, relative to the pipeline file's folder."},
    "args": {"type": "array", "items": {"type": "string"}, "default": [], "description": "Its arguments."},
    "codec": {"type": "string", "enum": ["proto", "json"], "default": "proto", "description": "How a driver of the current protocol writes its messages: proto (each a little-endian u32 length, then the protobuf message) or json (one JSON object a line). Not with protocol: transactions, whose messages are always proto."}"#,
        );
        Schemas::parse(&endpoint, EXTERNAL_RESOURCE_SCHEMA)
    }

    fn parse(&self, config: Value, base_dir: &Path) -> Result<Value, InvalidConfig> {
        let mut config: CommandConfig = parse(config)?;
        if config.codec == Some(Codec::Json) && config.protocol == Some(Protocol::Transactions) {
            return Err(InvalidConfig::new(
                "codec",
                "`codec: json` is for the current protocol only: the transactions protocol's \
                 messages are always protobuf frames; remove `codec` or set `protocol: current`",
            ));
        }
        if config.program.components().count() > 1 {
            resolve_path(&mut config.program, base_dir);
        }
        Ok(serde_json::to_value(config).expect("a command endpoint serializes"))
    }

    async fn connect(
        &self,
        materialization: &str,
        _state_dir: &Path,
        config: &Value,
    ) -> Result<Connected, String> {
        let CommandConfig {
            program,
            args,
            config,
            pattern,
            protocol,
            codec,
        } = serde_json::from_value(config.clone()).map_err(|e| e.to_string())?;
        Ok(Connected::flow(
            current::stdio::endpoint(
                materialization,
                program.to_string_lossy().as_ref(),
                args,
                protocol,
                codec.unwrap_or_default(),
            ),
            EndpointType::SluiceCommand,
            config,
            pattern.map(Into::into),
        )
        .speaking(protocol))
    }

    fn pinned(&self, config: &Value) -> Option<&'static str> {
        // `parse` returned this configuration, so it reads; were it not to, the
        // pattern is undeclared.
        let pattern = serde_json::from_value::<CommandConfig>(config.clone()).ok();
        declared_pinned(pattern.and_then(|c| c.pattern))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_endpoint_takes_a_protocol_and_a_codec_of_the_current_protocol_only() {
        let base = Path::new("/pipelines");
        let parsed = Command
            .parse(
                json!({"program": "driver", "protocol": "current", "codec": "json"}),
                base,
            )
            .unwrap();
        assert_eq!(parsed["protocol"], "current");
        assert_eq!(parsed["codec"], "json");
        // Unset, the protocol is detected and the codec is proto: neither is written.
        let parsed = Command.parse(json!({"program": "driver"}), base).unwrap();
        assert!(parsed.get("protocol").is_none() && parsed.get("codec").is_none());
        let err = Command
            .parse(
                json!({"program": "driver", "protocol": "transactions", "codec": "json"}),
                base,
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("codec: ") && err.contains("current protocol only"),
            "{err}"
        );
        let err = Command
            .parse(json!({"program": "driver", "protocol": "flow"}), base)
            .unwrap_err()
            .to_string();
        assert!(err.contains("protocol") && err.contains("current"), "{err}");
    }

    #[test]
    fn a_grpc_endpoint_takes_a_protocol() {
        let base = Path::new("/pipelines");
        let config = json!({"address": "127.0.0.1:7000", "protocol": "current"});
        let parsed = Grpc.parse(config, base).unwrap();
        assert_eq!(parsed["protocol"], "current");
        let err = Grpc
            .parse(json!({"address": "127.0.0.1:7000", "codec": "json"}), base)
            .unwrap_err()
            .to_string();
        assert!(err.contains("codec"), "{err}");
    }

    #[test]
    fn paths_resolve_at_the_top_and_inside_objects_and_absent_ones_are_skipped() {
        let mut config = json!({
            "path": "out/a.db",
            "tls": {"ca": "certs/ca.crt", "key": "/etc/key.pem"},
            "sasl": {"username": "u"}
        });
        let paths = ["path", "tls.ca", "tls.key", "sasl.password_file", "missing"];
        resolve_paths(&mut config, &paths, Path::new("/pipelines"));
        assert_eq!(
            config,
            json!({
                "path": "/pipelines/out/a.db",
                "tls": {"ca": "/pipelines/certs/ca.crt", "key": "/etc/key.pem"},
                "sasl": {"username": "u"}
            })
        );
    }
}
