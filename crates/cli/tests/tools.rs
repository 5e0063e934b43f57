//! The product binary holds only the product: `sluice bench` and `sluice torture` run the
//! binaries built beside it, and the `sluice` package pulls in no tool or test kit.

use crate::common;

use common::SLUICE;
use std::process::Command;

#[test]
fn sluice_bench_runs_the_bench_binary_beside_it() {
    let out = Command::new(SLUICE)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Usage: sluice bench"), "{stdout}");
    assert!(stdout.contains("combine"), "{stdout}");
}

#[test]
fn sluice_torture_runs_the_torture_binary_beside_it() {
    let out = Command::new(SLUICE)
        .args(["torture", "--help"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Usage: sluice torture"), "{stdout}");
    assert!(stdout.contains("--scenario"), "{stdout}");
}

#[test]
fn a_tool_that_is_not_built_is_named_with_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("sluice");
    std::fs::copy(SLUICE, &alone).unwrap();
    for (command, binary) in [("bench", "sluice-bench"), ("torture", "sluice-torture")] {
        let out = Command::new(&alone)
            .args([command, "combine"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("{binary} is not built beside"))
                && stderr.contains(&format!("cargo build -p {binary}")),
            "{stderr}"
        );
    }
}

/// The `sluice` package's normal dependencies, transitively: what its binary links.
fn product_dependencies() -> serde_json::Value {
    // This machine's target only: other platforms' dependencies are not downloaded.
    let rustc = Command::new("rustc").arg("-vV").output().unwrap();
    let rustc = String::from_utf8_lossy(&rustc.stdout);
    let host = (rustc.lines())
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names its host");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_product_links_no_tool_no_test_kit_and_no_testing_feature() {
    let metadata = product_dependencies();
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let node = |id: &str| nodes.iter().find(|n| n["id"] == id).unwrap();
    let name = |id: &str| {
        let package = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap();
        package["name"].as_str().unwrap().to_owned()
    };
    let root = nodes
        .iter()
        .find(|n| name(n["id"].as_str().unwrap()) == "sluice")
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![root["id"].as_str().unwrap().to_owned()];
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        for dep in node(&id)["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                todo.push(dep["pkg"].as_str().unwrap().to_owned());
            }
        }
    }
    let linked: Vec<String> = seen.iter().map(|id| name(id)).collect();
    for tool in ["sluice-bench", "sluice-torture", "sluice-testkit"] {
        assert!(!linked.iter().any(|n| n == tool), "sluice links {tool}");
    }
    // A `testing` feature is asked for by dev-dependencies only.
    for package in metadata["packages"].as_array().unwrap() {
        if !seen.contains(package["id"].as_str().unwrap()) {
            continue;
        }
        for dep in package["dependencies"].as_array().unwrap() {
            let testing = dep["features"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "testing");
            assert!(
                !(dep["kind"].is_null() && testing),
                "{} turns on {}'s `testing` feature for the product",
                package["name"],
                dep["name"]
            );
        }
    }
}

/// The runtime reaches every built-in driver through driver-sdk's one seam
/// (`BuiltinKind`): it never depends on the epoch sink or output SDKs.
#[test]
fn the_runtime_knows_no_driver_family_but_the_driver_sdk() {
    let metadata = product_dependencies();
    let runtime = (metadata["packages"].as_array().unwrap().iter())
        .find(|p| p["name"] == "sluice-runtime")
        .unwrap();
    let normal: Vec<&str> = (runtime["dependencies"].as_array().unwrap().iter())
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(normal.contains(&"sluice-driver-sdk"), "{normal:?}");
    for family in ["sluice-sink-sdk", "sluice-output-sdk"] {
        assert!(!normal.contains(&family), "the runtime depends on {family}");
    }
}
