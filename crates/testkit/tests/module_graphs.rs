//! No crate's modules import each other in a loop (ARCHITECTURE.md): each crate of the
//! workspace is read from its sources. One crate keeps a loop, named here with why:
//! `sluice-doc`, where a schema compiles its reducer (`reduce::build`) and the reducer
//! reports the schema's errors and reads its dialect.

use sluice_testkit::modules::cycles;
use std::path::{Path, PathBuf};

const KEPT: &[(&str, &str)] = &[
    ("doc", "reduce::build <-> schema"),
    ("doc", "reduce <-> schema"),
];

/// Every `src` folder of a crate under `crates/`.
fn crate_sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let src = dir.join("src");
    if dir.join("Cargo.toml").is_file() && src.is_dir() {
        found.push(src);
        return;
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            crate_sources(&path, found);
        }
    }
}

#[test]
fn no_crate_has_modules_that_import_each_other_in_a_loop() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = Vec::new();
    crate_sources(&crates, &mut sources);
    assert!(sources.len() > 20, "found only {sources:?}");
    let mut loops = Vec::new();
    for src in &sources {
        let name = src.parent().unwrap().strip_prefix(&crates).unwrap();
        let name = name.to_string_lossy().into_owned();
        for cycle in cycles(src) {
            if !KEPT.contains(&(name.as_str(), cycle.as_str())) {
                loops.push(format!("{name}: {cycle}"));
            }
        }
    }
    assert!(loops.is_empty(), "modules in a loop: {loops:#?}");
}
