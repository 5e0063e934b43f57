//! The binaries of one build sit in one folder (`target/release`, or wherever they were
//! installed together): `sluice bench` and `sluice torture` run `sluice-bench` and
//! `sluice-torture` from there, and those run `sluice` from there, so that a tool
//! always drives the product it was built with.

use anyhow::Context;
use std::path::PathBuf;

/// The binary `name` in the folder of the running one; an error naming how to build it
/// when it is not there.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the running binary")?;
    let dir = me
        .parent()
        .with_context(|| format!("{} has no folder", me.display()))?;
    let path = dir.join(name);
    let release = if dir.ends_with("release") {
        " --release"
    } else {
        ""
    };
    anyhow::ensure!(
        path.is_file(),
        "{name} is not built beside {} (build it: cargo build{release} -p {name})",
        me.display()
    );
    Ok(path)
}
