//! The docs stay true to the code: each connector page's configuration reference is
//! what `sluice schema <connector> --markdown` prints now (run with `SLUICE_BLESS=1` to
//! rewrite them), and every relative link of the README and `docs/` leads to a file.

use std::path::{Path, PathBuf};
use std::process::Command;

const BEGIN: &str = "<!-- sluice schema ";
const END: &str = "<!-- end sluice schema -->";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut folders = vec![root().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("docs/ is readable") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn schema_markdown(connector: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["schema", connector, "--markdown"])
        .output()
        .expect("sluice runs");
    assert!(
        out.status.success(),
        "sluice schema {connector}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn each_connector_page_holds_the_reference_its_schema_prints() {
    let bless = std::env::var_os("SLUICE_BLESS").is_some();
    let mut references = 0;
    let mut stale = Vec::new();
    for page in markdown_files() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        let mut fresh = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(BEGIN) {
            let after = &rest[at + BEGIN.len()..];
            let (connector, _) = after.split_once(" -->").expect("a closed marker");
            let end = after
                .find(END)
                .unwrap_or_else(|| panic!("{}: `{connector}` has no end marker", page.display()));
            let begin_line = &rest[..at + BEGIN.len() + connector.len() + " -->".len()];
            fresh.push_str(begin_line);
            fresh.push('\n');
            let reference = schema_markdown(connector);
            fresh.push_str(&reference);
            let written = &after[connector.len() + " -->".len()..end];
            if written.trim() != reference.trim() {
                stale.push(format!("{} ({connector})", page.display()));
            }
            fresh.push_str(END);
            rest = &after[end + END.len()..];
            references += 1;
        }
        fresh.push_str(rest);
        if bless && fresh != text {
            std::fs::write(&page, fresh).expect("the page is writable");
        }
    }
    assert!(references >= 12, "only {references} references in the docs");
    assert!(
        bless || stale.is_empty(),
        "configuration references differ from `sluice schema`; run this test with \
         SLUICE_BLESS=1 to rewrite them: {stale:?}"
    );
}

#[test]
fn every_relative_link_leads_to_a_file() {
    let mut broken = Vec::new();
    let mut links = 0;
    for page in markdown_files() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        let folder = page.parent().expect("a page's folder");
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for target in line.split("](").skip(1).filter_map(|s| s.split(')').next()) {
                let path = target.split('#').next().unwrap_or_default();
                if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                    continue;
                }
                links += 1;
                if !folder.join(path).exists() {
                    broken.push(format!("{}: {target}", page.display()));
                }
            }
        }
    }
    assert!(links > 50, "only {links} links found");
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}
