//! Flow's JSON codec of the current protocol against Flow's own regression snapshots
//! (estuary/flow `crates/proto-flow/tests/snapshots/regression__materialize_*_json.snap`):
//! each snapshot decodes, and encodes back to the same JSON value, less the fields our
//! protos leave out (which decoding must skip, as a connector must).

use serde_json::{Value, json};
use sluice_driver_sdk::current::json::{
    decode_request, decode_response, encode_request, encode_response,
};
use sluice_proto::current::{consumer, materialize as cm};

/// Fields of Flow's snapshots that Sluice's current protos do not declare.
const UNDECLARED: &[&str] = &[
    "enum",
    "reduce",
    "redact",
    "contentMediaType",
    "partitionTemplate",
    "partitionSelector",
    "groupBy",
    "notBefore",
    "notAfter",
    "shardTemplate",
    "recoveryLogTemplate",
    "statePatches",
];

fn without_undeclared(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.retain(|k, _| !UNDECLARED.contains(&k.as_str()));
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

fn collection() -> Value {
    json!({
        "name": "acmeCo/collection",
        "writeSchema": {"write": "schema"},
        "readSchema": {"read": "schema"},
        "key": ["/key/one", "/key/two"],
        "uuidPtr": "/_meta/uuid",
        "partitionFields": ["type", "region"],
        "projections": [{
            "ptr": "/json/ptr",
            "field": "a-field",
            "isPartitionKey": true,
            "inference": {
                "types": ["integer", "string"],
                "string": {
                    "contentType": "typ",
                    "format": "date",
                    "contentEncoding": "enc",
                    "maxLength": 12345
                },
                "title": "title",
                "description": "desc",
                "default": {"def": "ault"},
                "exists": "MUST",
                "numeric": {"hasMinimum": true, "minimum": -1000.0},
                "array": {
                    "minItems": 10,
                    "hasMaxItems": true,
                    "maxItems": 20,
                    "itemTypes": ["null", "integer"]
                },
                "enum": ["const-one", "const-two"],
                "reduce": "REDUCE_MERGE",
                "redact": "REDACT_SHA256",
                "contentMediaType": "typ"
            }
        }],
        "ackTemplate": {"ack": "true"},
        "partitionTemplate": {
            "name": "partition/template",
            "replication": 3,
            "fragment": {"length": "112233", "compressionCodec": "ZSTANDARD"}
        }
    })
}

fn materialization() -> Value {
    json!({
        "name": "acmeCo/materialization",
        "connectorType": "IMAGE",
        "config": {"materialize": {"config": 42}},
        "bindings": [{
            "resourceConfig": {"resource": "config"},
            "resourcePath": ["some", "path"],
            "collection": collection(),
            "partitionSelector": {"include": {"labels": [{"name": "estuary.dev/foo", "value": "v"}]}},
            "priority": 3,
            "fieldSelection": {
                "keys": ["key/one"],
                "values": ["val/two"],
                "document": "flow_document",
                "fieldConfig": {"a_field": {"field": "config"}, "other/field": 42.5}
            },
            "journalReadSuffix": "materialize/acmeCo/materialization/some%20path.v1",
            "notBefore": "2023-08-11T03:00:27+00:00",
            "notAfter": "2023-03-28T10:40:00+00:00",
            "backfill": 1,
            "stateKey": "some%20path.v1",
            "serPolicy": {
                "strTruncateAfter": 65536,
                "nestedObjTruncateAfter": 1000,
                "arrayTruncateAfter": 1000
            }
        }],
        "shardTemplate": {"id": "shard/template", "maxTxnDuration": "60s"},
        "recoveryLogTemplate": {"name": "recovery/template", "replication": 3},
        "networkPorts": [{"number": 8080, "protocol": "https", "public": true}, {"number": 9000}],
        "triggers": [{"method": "POST", "payloadTemplate": "{}", "url": "https://example.com/webhook"}]
    })
}

fn checkpoint() -> Value {
    json!({
        "sources": {
            "a/read/journal;suffix": {
                "readThrough": "12345",
                "producers": [
                    {"id": "AwkIBQc=", "state": {"lastAck": "8675", "begin": "1111"}},
                    {"id": "BwxmKx0=", "state": {"lastAck": "309", "begin": "2222"}}
                ]
            }
        },
        "ackIntents": {"an/ack/journal": "AwQCBQ=="}
    })
}

/// Flow's `regression__materialize_request_json.snap` (its 3.14159 is Flow's, not π).
#[allow(clippy::approx_constant)]
fn request_snapshot() -> Value {
    json!({
        "spec": {"connectorType": "IMAGE", "config": {"spec": "config"}},
        "validate": {
            "name": "validate/materialization",
            "connectorType": "IMAGE",
            "config": {"validate": "config"},
            "bindings": [{
                "resourceConfig": {"resource": "config"},
                "collection": collection(),
                "fieldConfig": {"a_field": {"field": "config"}, "other/field": 42.5},
                "backfill": 3,
                "groupBy": ["key/one"]
            }],
            "lastVersion": "00:11:22:33"
        },
        "apply": {
            "materialization": materialization(),
            "version": "11:22:33:44",
            "lastVersion": "00:11:22:33",
            "state": {"connector": "state"}
        },
        "open": {
            "materialization": materialization(),
            "version": "11:22:33:44",
            "range": {
                "keyBegin": 1122867,
                "keyEnd": 1146447479,
                "rClockBegin": 2291772091u32,
                "rClockEnd": 3437096703u32
            },
            "state": {"connector": {"state": 42}}
        },
        "load": {"binding": 12, "key": [42, "hi"], "keyPacked": "VkseCQ=="},
        "flush": {"statePatches": [{"flushed": 1}]},
        "store": {
            "binding": 3,
            "key": [true, null],
            "keyPacked": "WhUA",
            "values": [3.14159, "field!"],
            "valuesPacked": "PFs=",
            "doc": {"full": "document"},
            "exists": true,
            "delete": true
        },
        "startCommit": {"runtimeCheckpoint": checkpoint(), "statePatches": [{"started": "commit"}]},
        "acknowledge": {"statePatches": [{"acked": true}]},
        "$internal": "EgJIaRgB"
    })
}

/// Flow's `regression__materialize_response_json.snap`.
fn response_snapshot() -> Value {
    let state = json!({"updated": {"state": "update"}, "mergePatch": true});
    json!({
        "spec": {
            "protocol": 3032023,
            "configSchema": {"config": "schema"},
            "resourceConfigSchema": {"resource": "schema"},
            "documentationUrl": "https://example/docs",
            "oauth2": {
                "provider": "oauth-provider",
                "authUrlTemplate": "https://auth-url",
                "accessTokenUrlTemplate": "https://access-token",
                "accessTokenMethod": "POST",
                "accessTokenBody": "foo",
                "accessTokenHeaders": {"hdr-one": {"hello": "hdr"}, "hdr-two": 42.5},
                "accessTokenResponseMap": {"foo": true, "key": "value"},
                "refreshTokenUrlTemplate": "https://refresh-token",
                "refreshTokenMethod": "POST",
                "refreshTokenBody": "refresh!",
                "refreshTokenHeaders": {"hdr-three": {"refresh": "hdr"}},
                "refreshTokenResponseMap": {"access": "here"}
            }
        },
        "validated": {
            "bindings": [{
                "constraints": {
                    "rec_field": {"type": "LOCATION_RECOMMENDED", "reason": "is recommended"},
                    "req_field": {"type": "FIELD_REQUIRED", "reason": "is required"}
                },
                "resourcePath": ["some", "path"],
                "deltaUpdates": true
            }]
        },
        "applied": {"actionDescription": "I did some stuff", "state": state},
        "opened": {"runtimeCheckpoint": checkpoint()},
        "loaded": {"binding": 4, "doc": {"loaded": "doc"}},
        "flushed": {"state": state},
        "startedCommit": {"state": state},
        "acknowledged": {"state": state},
        "$internal": "EgJIaRgB"
    })
}

fn parse(line: &[u8]) -> Value {
    assert!(!line.contains(&b'\n'), "one line");
    serde_json::from_slice(line).expect("the encoder writes JSON")
}

#[test]
fn flows_request_snapshot_decodes_and_encodes_back_to_the_same_json() {
    let snapshot = request_snapshot();
    let request = decode_request(snapshot.to_string().as_bytes()).expect("decodes");

    let load = request.load.as_ref().unwrap();
    assert_eq!(load.binding, 12);
    assert_eq!(load.key_json, br#"[42,"hi"]"#);
    assert_eq!(load.key_packed, [0x56, 0x4b, 0x1e, 0x09]);
    let open = request.open.as_ref().unwrap();
    assert_eq!(open.range.unwrap().r_clock_end, 3437096703);
    assert_eq!(open.state_json, br#"{"connector":{"state":42}}"#);
    let spec = open.materialization.as_ref().unwrap();
    assert_eq!(spec.bindings[0].state_key, "some%20path.v1");
    let field_config = &spec.bindings[0]
        .field_selection
        .as_ref()
        .unwrap()
        .field_config_json_map;
    assert_eq!(field_config["other/field"], b"42.5");
    let store = request.store.as_ref().unwrap();
    assert!(store.delete && store.exists);
    assert_eq!(store.values_json, br#"[3.14159,"field!"]"#);
    let cp = request
        .start_commit
        .as_ref()
        .unwrap()
        .runtime_checkpoint
        .as_ref()
        .unwrap();
    assert_eq!(cp.sources["a/read/journal;suffix"].read_through, 12345);
    assert_eq!(cp.ack_intents["an/ack/journal"], [3, 4, 2, 5]);
    assert!(request.flush.is_some() && request.acknowledge.is_some());
    assert_eq!(request.internal, [0x12, 0x02, b'H', b'i', 0x18, 0x01]);

    assert_eq!(
        parse(&encode_request(&request)),
        without_undeclared(snapshot)
    );
}

#[test]
fn flows_response_snapshot_decodes_and_encodes_back_to_the_same_json() {
    let snapshot = response_snapshot();
    let response = decode_response(snapshot.to_string().as_bytes()).expect("decodes");

    let spec = response.spec.as_ref().unwrap();
    assert_eq!(spec.protocol, sluice_proto::current::PROTOCOL);
    assert_eq!(spec.config_schema_json, br#"{"config":"schema"}"#);
    let oauth2 = spec.oauth2.as_ref().unwrap();
    assert_eq!(oauth2.access_token_response_json_map["foo"], b"true");
    assert_eq!(oauth2.access_token_headers_json_map["hdr-two"], b"42.5");
    let constraint = &response.validated.as_ref().unwrap().bindings[0].constraints["req_field"];
    assert_eq!(constraint.r#type, 1);
    let state = response.flushed.as_ref().unwrap().state.as_ref().unwrap();
    assert_eq!(state.updated_json, br#"{"state":"update"}"#);
    assert!(state.merge_patch);

    assert_eq!(
        parse(&encode_response(&response)),
        without_undeclared(snapshot)
    );
}

/// The sentinel a connector returns to ask for a rebuild: a checkpoint of one field.
#[test]
fn a_rebuild_checkpoint_travels_as_json() {
    let response = cm::Response {
        opened: Some(cm::response::Opened {
            runtime_checkpoint: Some(consumer::Checkpoint {
                rebuild_from_zero: true,
                ..Default::default()
            }),
            disable_load_optimization: false,
        }),
        ..Default::default()
    };
    let line = encode_response(&response);
    assert_eq!(
        parse(&line),
        json!({"opened": {"runtimeCheckpoint": {"rebuildFromZero": true}}})
    );
    assert_eq!(decode_response(&line).unwrap(), response);
}

#[test]
fn empty_messages_are_written_as_empty_objects() {
    let request = cm::Request {
        flush: Some(cm::request::Flush {}),
        ..Default::default()
    };
    assert_eq!(parse(&encode_request(&request)), json!({"flush": {}}));
    assert_eq!(decode_request(br#"{"flush":{}}"#).unwrap(), request);
}
