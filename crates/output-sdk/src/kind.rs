//! [`OutputKind`]: an output endpoint kind as a binary registers it, and what every
//! kind shares: the endpoint's `view` (where the view lives, taken out before the
//! kind's own strict check), a binding's encoding keys ([`Resource`]), both schemas,
//! and the admission answers for a cluster (`pinned`, `singleton`).
//!
//! Under `cluster:` an output needs two things: a view every member reaches that
//! fences a former holder (`view: {url: postgres://…}`), and a destination that refuses
//! a former holder's late messages ([`OutputKind::late_writes`] is `None`). And it
//! always runs as one shard: a binding's changes are one stream, numbered by one
//! writer's transactions.

use crate::config::Endpoint;
use crate::encode::Encoding;
use crate::endpoint::{OutputEndpoint, Target};
use crate::{OutputError, Result as OutputResult};
use serde_json::{Value, json};

/// Why an output whose view is local cannot run under `cluster:`.
pub const LOCAL_VIEW: &str = "an output keeps its view beside the local recovery log unless \
    told otherwise (each key's last document for the changes' before-images, the checkpoint \
    and the fence, in one machine's SQLite file), where another member cannot read it; keep \
    it in PostgreSQL, which every member reaches and which fences a former holder: \
    `view: {url: postgres://…}` in the endpoint";

/// Why an output runs as one shard, in a cluster and under `runtime.workers` alike.
pub const ONE_STREAM: &str =
    "a binding's changes are one ordered stream, numbered by one writer's transactions";

/// An output endpoint kind, as a binary registers it.
#[derive(Clone, Copy)]
pub struct OutputKind {
    /// Its key in an endpoint of the pipeline file (`kafka`).
    pub name: &'static str,
    /// Keys of its configuration that hold paths (dotted inside an object: `tls.ca`).
    pub paths: &'static [&'static str],
    /// The JSON schema of its endpoint configuration (derived from the type it is
    /// parsed with); `view` is added.
    pub endpoint_schema: fn() -> String,
    /// The JSON schema of a binding's destination keys; the encoding keys are added.
    pub resource_schema: fn() -> String,
    /// Checks an endpoint configuration (without `view`) strictly; connects nothing.
    pub check: fn(&Value) -> OutputResult<()>,
    /// The resource path of a binding's destination (`[topic]`).
    pub resource_path: fn(&Value) -> OutputResult<Vec<String>>,
    /// The endpoint of one binding (its configuration without `view`); connects nothing
    /// until its `open`.
    pub endpoint: fn(&Value, Target) -> OutputResult<Box<dyn OutputEndpoint>>,
    /// Why a former holder's late messages could still reach the destination after
    /// another member took the shard over (so the kind cannot run under `cluster:`);
    /// `None`: the destination refuses them.
    pub late_writes: Option<&'static str>,
}

impl OutputKind {
    /// An endpoint configuration split ([`Endpoint::parse`]) and its kind's keys
    /// checked strictly. The kind's error for an unknown key lists the kind's own keys;
    /// `view`, taken out before, is one the endpoint takes too, so it is listed.
    pub(crate) fn checked(&self, config: &Value) -> OutputResult<Endpoint> {
        let endpoint = Endpoint::parse(config)?;
        (self.check)(&endpoint.kind).map_err(|err| match err {
            OutputError::Config(message) if message.contains("unknown field `") => {
                OutputError::Config(format!("{message}, or `view`"))
            }
            other => other,
        })?;
        Ok(endpoint)
    }
}

/// A binding's resource: its destination and how its changes are encoded.
#[derive(Debug, Clone)]
pub struct Resource {
    pub destination: Value,
    pub encoding: Encoding,
    pub snapshot: bool,
}

impl Resource {
    /// Splits a resource configuration into the encoding keys and the destination.
    pub fn parse(resource: &Value) -> OutputResult<Resource> {
        let Value::Object(fields) = resource else {
            return Err(OutputError::Config(format!(
                "a resource is an object, not {resource}"
            )));
        };
        let (mut encoding, mut destination) = (serde_json::Map::new(), serde_json::Map::new());
        let mut snapshot = false;
        for (key, value) in fields {
            match key.as_str() {
                "format" | "schema_id" | "key_schema_id" => {
                    encoding.insert(key.clone(), value.clone());
                }
                "snapshot" => {
                    snapshot = value.as_bool().ok_or_else(|| {
                        OutputError::Config(format!(
                            "snapshot: expected true or false, not {value}"
                        ))
                    })?;
                }
                _ => {
                    destination.insert(key.clone(), value.clone());
                }
            }
        }
        let encoding = serde_json::from_value(Value::Object(encoding))
            .map_err(|e| OutputError::Config(format!("resource: {e}")))?;
        Ok(Resource {
            destination: Value::Object(destination),
            encoding,
            snapshot,
        })
    }
}

/// The JSON schema of a binding's resource of `kind`: its destination keys and the
/// encoding keys every output takes. The encoding keys are written here, not derived:
/// [`Resource::parse`] takes them out by hand before the destination is parsed.
pub fn resource_schema(kind: &OutputKind) -> String {
    let mut schema: Value =
        serde_json::from_str(&(kind.resource_schema)()).expect("a kind's resource schema is JSON");
    let common = json!({
        "format": {"enum": ["json", "debezium", "csv", "avro"], "default": "json",
                   "description": "How changes are encoded"},
        "snapshot": {"type": "boolean", "default": false,
                     "description": "The binding's first batch is its whole view"},
        "schema_id": {"type": "integer", "minimum": 0,
                      "description": "Avro: Confluent framing of values with this schema id"},
        "key_schema_id": {"type": "integer", "minimum": 0,
                          "description": "Avro: Confluent framing of keys with this schema id"},
    });
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.extend(common.as_object().expect("an object").clone());
    }
    schema.to_string()
}

/// The JSON schema of an endpoint of `kind`: its own keys and `view`, the PostgreSQL
/// schema holding the view (the client's endpoint schema, described for this use).
/// Added here, not derived: [`Endpoint::parse`] takes `view` out before the kind's
/// check.
pub fn endpoint_schema(kind: &OutputKind) -> String {
    let mut schema: Value =
        serde_json::from_str(&(kind.endpoint_schema)()).expect("a kind's endpoint schema is JSON");
    let mut view: Value = serde_json::from_str(&sluice_pg_client::ENDPOINT_SCHEMA)
        .expect("the view's schema is JSON");
    if let Some(Value::Object(schema)) = view.pointer_mut("/properties/schema") {
        schema.insert(
            "description".into(),
            json!(
                "Schema holding the view's tables; created with them at the first open if missing"
            ),
        );
    }
    if let Value::Object(view) = &mut view {
        view.remove("$schema");
        view.insert("title".into(), json!("Output view in PostgreSQL"));
        view.insert(
            "description".into(),
            json!(
                "Where the output keeps its view (each key's last document, which gives a \
                 change its before-image; the checkpoint; the key range's fence): tables \
                 sluice_output_* in a PostgreSQL schema, which every member of a cluster \
                 reaches, so the output can run under `cluster:`. Without it, a SQLite file \
                 beside the local recovery log."
            ),
        );
    }
    if let Value::Object(fields) = &mut schema {
        let properties = fields.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(properties) = properties {
            properties.insert("view".into(), view);
        }
    }
    schema.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;
    use sluice_driver_sdk::BuiltinKind;

    #[test]
    fn a_resource_splits_into_its_destination_and_its_encoding() {
        let r = Resource::parse(&json!({"topic": "t", "format": "avro", "schema_id": 7,
                                        "snapshot": true}))
        .unwrap();
        assert_eq!(r.destination, json!({"topic": "t"}));
        assert_eq!(r.encoding.format, encode::Format::Avro);
        assert_eq!(r.encoding.schema_id, Some(7));
        assert!(r.snapshot);
        let err = Resource::parse(&json!({"topic": "t", "format": "xml"})).unwrap_err();
        assert!(err.to_string().contains("xml"), "{err}");
        let err = Resource::parse(&json!({"snapshot": "yes"})).unwrap_err();
        assert!(err.to_string().contains("snapshot"), "{err}");
    }

    /// A kind whose own configuration is `{"path": …}`, checked strictly.
    fn kind(late_writes: Option<&'static str>) -> OutputKind {
        OutputKind {
            name: "test",
            paths: &[],
            endpoint_schema: || {
                r#"{"type":"object","properties":{"path":{"type":"string"}},"additionalProperties":false}"#
                    .into()
            },
            resource_schema: || r#"{"type":"object","properties":{}}"#.into(),
            check: |config| match config.as_object() {
                Some(fields) if fields.keys().all(|k| k == "path") => Ok(()),
                _ => Err(OutputError::Config(format!("unknown keys in {config}"))),
            },
            resource_path: |_| Ok(vec!["r".into()]),
            endpoint: |_, _| Err(OutputError::Config("not in this test".into())),
            late_writes,
        }
    }

    #[test]
    fn an_output_runs_in_a_cluster_only_with_a_shared_view_and_a_fencing_destination() {
        let local = json!({"path": "p"});
        let shared = json!({"path": "p", "view": {"url": "postgres://db/x", "schema": "v"}});
        let refusing = kind(None);
        assert_eq!(refusing.pinned(&local), Some(LOCAL_VIEW));
        assert!(
            LOCAL_VIEW.contains("view: {url: postgres://"),
            "names the fix"
        );
        assert_eq!(refusing.pinned(&shared), None);
        let late = kind(Some("late messages land"));
        assert_eq!(late.pinned(&local), Some(LOCAL_VIEW));
        assert_eq!(late.pinned(&shared), Some("late messages land"));
        for config in [&local, &shared] {
            assert_eq!(refusing.singleton(config), Some(ONE_STREAM));
            assert_eq!(late.singleton(config), Some(ONE_STREAM));
        }
    }

    #[test]
    fn view_is_taken_out_before_the_kinds_strict_check_and_parsed_strictly() {
        let kind = kind(None);
        let shared = json!({"path": "p", "view": {"url": "postgres://db/x"}});
        kind.check(&shared).expect("the kind never sees `view`");
        let endpoint = Endpoint::parse(&shared).unwrap();
        assert_eq!(endpoint.kind, json!({"path": "p"}));
        assert_eq!(endpoint.view.unwrap().schema(), "public");
        for (bad, says) in [
            (json!({"view": {"url": "mysql://db"}}), "view: url:"),
            (
                json!({"view": {"url": "postgres://db", "table": "t"}}),
                "view:",
            ),
            (json!({"view": "postgres://db"}), "view:"),
        ] {
            let err = kind.check(&bad).unwrap_err().message;
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(kind.check(&json!({"path": "p", "other": 1})).is_err());
    }

    #[test]
    fn the_endpoint_schema_describes_view() {
        let schema: Value = serde_json::from_str(&endpoint_schema(&kind(None))).unwrap();
        let view = &schema["properties"]["view"];
        assert_eq!(view["properties"]["url"]["type"], "string", "{view}");
        assert!(view["description"].as_str().unwrap().contains("cluster"));
        assert!(
            schema["properties"]["path"].is_object(),
            "the kind's keys stay"
        );
        assert!(view.get("$schema").is_none());
    }
}
