//! The registry of kinds: what it lists, what each driver kind connects, and that a
//! kind registered twice is refused.

use serde_json::json;
use sluice_datagen::DatagenKind;
use sluice_driver_sdk::Builtin;
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::flow::EndpointType;
use sluice_file::FileKind;
use sluice_memory::MemoryDriver;
use sluice_memory::config::EndpointConfig;
use sluice_runtime::config::EndpointDef;
use sluice_runtime::pipeline::Connect;
use sluice_runtime::registry::{Command, Grpc, Registry};
use sluice_source_sdk::kind;
use std::path::Path;
use std::sync::Arc;

fn memory() -> Arc<dyn Driver> {
    Arc::new(MemoryDriver::new())
}

fn registry() -> Registry {
    Registry::new()
        .with_source(kind::<FileKind>())
        .with_source(kind::<DatagenKind>())
        .with_driver(Grpc)
        .with_builtin(Builtin::new::<EndpointConfig>(
            "memory",
            EndpointType::SluiceMemory,
            &["path"],
            memory,
        ))
        .with_driver(Command)
}

#[test]
fn names_are_listed_sorted_and_only_in_process_drivers_are_built_in() {
    let r = registry();
    assert_eq!(r.source_names(), ["datagen", "file"]);
    assert_eq!(r.driver_names(), ["command", "grpc", "memory"]);
    assert_eq!(r.builtin_driver_names(), ["memory"]);
    assert!(r.driver("memory").unwrap().driver().is_some());
    assert!(r.driver("grpc").unwrap().driver().is_none());
    assert!(r.driver("sqlite").is_none() && r.source("kafka").is_none());
}

#[test]
#[should_panic(expected = "source kind \"file\" registered twice")]
fn a_source_kind_registered_twice_is_a_bug() {
    let _ = registry().with_source(kind::<FileKind>());
}

#[test]
#[should_panic(expected = "driver kind \"grpc\" registered twice")]
fn a_driver_kind_registered_twice_is_a_bug() {
    let _ = registry().with_driver(Grpc);
}

#[test]
fn a_builtin_resolves_its_path_keys_and_keeps_the_rest_as_written() {
    let memory = registry();
    let memory = memory.driver("memory").unwrap();
    let base = Path::new("/pipelines");
    for (config, expected) in [
        (json!({}), json!({})),
        (
            json!({"path": "state.json"}),
            json!({"path": "/pipelines/state.json"}),
        ),
        (
            json!({"path": "/srv/state.json"}),
            json!({"path": "/srv/state.json"}),
        ),
    ] {
        assert_eq!(
            memory.parse(config.clone(), base).unwrap(),
            expected,
            "{config}"
        );
    }
    let error = memory.parse(json!({"pth": "x"}), base).unwrap_err();
    assert!(error.message.contains("unknown field `pth`"), "{error}");
}

#[tokio::test]
async fn the_registry_connects_a_builtin_in_process_with_its_config() {
    let endpoint = EndpointDef {
        kind: "memory".to_string(),
        config: json!({}),
    };
    let connected = registry()
        .connect("views", Path::new("/nonexistent"), &endpoint)
        .await
        .unwrap();
    assert_eq!(connected.endpoint_type, EndpointType::SluiceMemory);
    assert_eq!(connected.config, json!({}));
    let unknown = EndpointDef {
        kind: "sqlite".to_string(),
        config: json!({}),
    };
    let error = registry()
        .connect("views", Path::new("/nonexistent"), &unknown)
        .await
        .err()
        .unwrap();
    assert!(error.contains("sqlite"), "{error}");
}

#[tokio::test]
async fn a_command_endpoint_sends_its_inner_config() {
    let command = registry();
    let command = command.driver("command").unwrap();
    let config = command
        .parse(
            json!({"program": "sluice", "config": {"level": 3}}),
            Path::new("/"),
        )
        .unwrap();
    let connected = command
        .connect("views", Path::new("/nonexistent"), &config)
        .await
        .unwrap();
    assert_eq!(connected.endpoint_type, EndpointType::SluiceCommand);
    assert_eq!(connected.config, json!({"level": 3}));
}

#[test]
fn a_grpc_address_is_checked_at_parse_time_and_may_be_a_plain_host_and_port() {
    let grpc = registry();
    let grpc = grpc.driver("grpc").unwrap();
    let base = Path::new("/pipelines");
    for address in [
        "grpc://127.0.0.1:7000",
        "localhost:7000",
        "unix:/run/d.sock",
    ] {
        let parsed = grpc.parse(json!({"address": address}), base).unwrap();
        assert_eq!(
            parsed,
            json!({"address": address, "config": {}}),
            "{address}"
        );
    }
    let error = grpc
        .parse(json!({"address": "localhost"}), base)
        .unwrap_err();
    assert_eq!(error.place, "address");
    assert!(error.message.contains("HOST:PORT"), "{error}");
}
