use super::*;

fn parse(line: &str) -> Message<'_> {
    Airbyte::parse(line.as_bytes()).unwrap()
}

#[test]
fn a_record_hands_on_its_data_as_written() {
    let line = r#"{"type":"RECORD","record":{"stream":"users","data":{"id":1, "name":"Zoë"},"emitted_at":1}}"#;
    let Message::Record { stream, data } = parse(line) else {
        panic!("not a record")
    };
    assert_eq!(stream, "users");
    assert_eq!(data.get(), r#"{"id":1, "name":"Zoë"}"#, "not re-serialised");
}

#[test]
fn logs_traces_and_statuses_are_told_apart() {
    let error = parse(r#"{"type":"LOG","log":{"level":"ERROR","message":"boom"}}"#);
    assert!(matches!(error, Message::Log { error: true, ref message } if message == "boom"));
    let info = parse(r#"{"type":"LOG","log":{"level":"INFO","message":"hi"}}"#);
    assert!(matches!(info, Message::Log { error: false, .. }));
    let config = parse(
        r#"{"type":"TRACE","trace":{"type":"ERROR","emitted_at":1,"error":{"message":"bad key","failure_type":"config_error"}}}"#,
    );
    assert!(matches!(config, Message::Error { config: true, ref message } if message == "bad key"));
    let system = parse(
        r#"{"type":"TRACE","trace":{"type":"ERROR","error":{"internal_message":"oops","failure_type":"system_error"}}}"#,
    );
    assert!(matches!(system, Message::Error { config: false, ref message } if message == "oops"));
    let estimate = parse(
        r#"{"type":"TRACE","trace":{"type":"ESTIMATE","estimate":{"name":"users","type":"STREAM","row_estimate":5}}}"#,
    );
    assert!(matches!(estimate, Message::Estimate { rows: 5, ref stream } if stream == "users"));
    let status = parse(
        r#"{"type":"TRACE","trace":{"type":"STREAM_STATUS","stream_status":{"status":"RUNNING"}}}"#,
    );
    assert!(matches!(status, Message::Other));
    let failed = parse(
        r#"{"type":"CONNECTION_STATUS","connectionStatus":{"status":"FAILED","message":"no such host"}}"#,
    );
    assert!(matches!(failed, Message::Status(Err(ref m)) if m == "no such host"));
    let ok = parse(r#"{"type":"CONNECTION_STATUS","connectionStatus":{"status":"SUCCEEDED"}}"#);
    assert!(matches!(ok, Message::Status(Ok(()))));
    assert!(matches!(
        parse(r#"{"type":"SPEC","spec":{}}"#),
        Message::Other
    ));
    assert!(Airbyte::parse(b"Starting the connector...").is_err());
}

fn stream_state(name: &str, cursor: u64) -> Value {
    json!({"type": "STREAM", "stream": {"stream_descriptor": {"name": name},
           "stream_state": {"cursor": cursor}}, "sourceStats": {"recordCount": 4.0}})
}

#[test]
fn per_stream_states_keep_each_streams_latest_without_counts() {
    let mut state = AirbyteState::None;
    Airbyte::absorb(&mut state, stream_state("users", 1)).unwrap();
    Airbyte::absorb(&mut state, stream_state("products", 7)).unwrap();
    let file = Airbyte::absorb(&mut state, stream_state("users", 2)).unwrap();
    let cursors: Vec<(&str, u64)> = file
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert!(m.get("sourceStats").is_none(), "{m}");
            (
                m["stream"]["stream_descriptor"]["name"].as_str().unwrap(),
                m["stream"]["stream_state"]["cursor"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(cursors, vec![("users", 2), ("products", 7)]);
    assert_eq!(
        Airbyte::state_from(&file).unwrap(),
        state,
        "a resume position reads back as the state it was written from"
    );
}

#[test]
fn a_global_state_replaces_and_a_legacy_one_is_its_data() {
    let mut state = AirbyteState::None;
    Airbyte::absorb(&mut state, stream_state("users", 1)).unwrap();
    let global =
        json!({"type": "GLOBAL", "global": {"shared_state": {"lsn": 9}, "stream_states": []}});
    let file = Airbyte::absorb(&mut state, global.clone()).unwrap();
    assert_eq!(file, json!([global]));
    assert_eq!(Airbyte::state_from(&file).unwrap(), state);
    let legacy = Airbyte::absorb(&mut state, json!({"data": {"users": {"cursor": 3}}})).unwrap();
    assert_eq!(legacy, json!({"users": {"cursor": 3}}));
    assert_eq!(Airbyte::state_from(&legacy).unwrap(), state);
    assert_eq!(
        Airbyte::state_from(&Value::Null).unwrap(),
        AirbyteState::None
    );
    assert!(Airbyte::absorb(&mut state, json!({"type": "WHAT"})).is_err());
    assert!(Airbyte::state_from(&json!(3)).is_err());
}

fn offered() -> Vec<Stream> {
    let catalog = r#"{"type":"CATALOG","catalog":{"streams":[
        {"name":"users","json_schema":{"type":"object"},"supported_sync_modes":["full_refresh","incremental"],
         "source_defined_cursor":true,"default_cursor_field":["updated_at"],"source_defined_primary_key":[["id"]]},
        {"name":"files","json_schema":{"type":"object"},"supported_sync_modes":["full_refresh"]}]}}"#
        .replace('\n', " ");
    let output = format!(
        "{{\"type\":\"LOG\",\"log\":{{\"level\":\"INFO\",\"message\":\"x\"}}}}\n{catalog}\n"
    );
    Airbyte::catalog(output.as_bytes()).unwrap()
}

#[test]
fn discover_reads_names_schemas_keys_and_modes() {
    let streams = offered();
    assert_eq!(streams[0].name, "users");
    assert_eq!(streams[0].key, vec!["/id"]);
    assert!(streams[0].incremental);
    assert_eq!(streams[1].key, Vec::<String>::new());
    assert!(!streams[1].incremental);
    let failed = br#"{"type":"TRACE","trace":{"type":"ERROR","error":{"message":"bad token"}}}"#;
    assert_eq!(Airbyte::catalog(failed).unwrap_err(), "bad token");
}

#[test]
fn the_configured_catalog_holds_the_selected_streams_modes_and_keys() {
    let select = |name: &str, key: Option<Vec<&str>>| StreamSelect {
        name: name.into(),
        key: key.map(|k| k.into_iter().map(String::from).collect()),
        sync_mode: None,
    };
    let catalog = Airbyte::configured(
        &offered(),
        &[
            select("files", Some(vec!["/path", "/row/n"])),
            select("users", None),
        ],
    )
    .unwrap();
    let streams = catalog["streams"].as_array().unwrap();
    assert_eq!(streams[0]["stream"]["name"], "files");
    assert_eq!(streams[0]["sync_mode"], "full_refresh");
    assert_eq!(streams[0]["primary_key"], json!([["path"], ["row", "n"]]));
    assert_eq!(streams[1]["sync_mode"], "incremental");
    assert_eq!(streams[1]["primary_key"], json!([["id"]]));
    assert_eq!(streams[1]["cursor_field"], json!(["updated_at"]));
    let unknown = Airbyte::configured(&offered(), &[select("orders", None)]).unwrap_err();
    assert!(unknown.contains("it offers: users, files"), "{unknown}");
}

#[test]
fn a_specs_defaults_fill_the_configuration_keys_it_declares() {
    let spec = br#"{"type":"LOG","log":{"level":"INFO","message":"x"}}
{"type":"SPEC","spec":{"connectionSpecification":{"properties":{"count":{"type":"integer","default":1000},"seed":{"default":-1},"token":{"type":"string"}}}}}"#;
    let defaults = Airbyte::defaults(spec);
    assert_eq!(Value::Object(defaults), json!({"count": 1000, "seed": -1}));
    assert!(Airbyte::defaults(b"not a spec").is_empty());
}
