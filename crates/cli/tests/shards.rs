//! Shards split a materialization by key hash: each reads the whole input and keeps the
//! documents whose key hashes into its range (`shard: {key_begin, key_end}`). Two shards
//! over the two halves write disjoint keys, each in its range, whose union is what one
//! shard over every key writes; run at once into one PostgreSQL table, they end exact,
//! also when each is SIGKILLed again and again and restarted.

use crate::common;

use common::{
    POSTGRES_URL, Row, SLUICE, Schema, assert_success, generate, pipeline_yaml, postgres_table,
    reduce_expected, sqlite_table, write_lines,
};
use serde_json::json;
use sluice_doc::key_hash;
use sluice_doc::tuple::pack_key;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const HALVES: [(u32, u32); 2] = [(0, 0x7fff_ffff), (0x8000_0000, u32::MAX)];

/// A pipeline over `input` into `endpoint`, as the shard `range`, with its own recovery
/// log `log`.
fn write_pipeline(dir: &Path, endpoint: &str, range: (u32, u32), log: &str) -> std::path::PathBuf {
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        endpoint,
        false,
        3000,
        "10s",
    )
    .replace(
        "  views-db:\n",
        &format!(
            "  views-db:\n    shard: {{key_begin: {}, key_end: {}}}\n",
            range.0, range.1
        ),
    );
    let yaml = format!("{yaml}  recovery_log: {log}\n");
    let path = dir.join(format!("{log}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn hash_of(user: &str) -> u32 {
    key_hash(&pack_key(&[json!(user)]))
}

#[test]
fn two_shards_over_split_ranges_write_disjoint_keys_that_add_up_to_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(20_000, 2_000, 11);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let run = |range: (u32, u32), name: &str| -> BTreeMap<String, Row> {
        let endpoint = format!("sqlite: {{path: {name}.db}}");
        let pipeline = write_pipeline(dir.path(), &endpoint, range, name);
        let out = Command::new(SLUICE)
            .arg("run")
            .arg(&pipeline)
            .output()
            .unwrap();
        assert_success(&out);
        sqlite_table(&dir.path().join(format!("{name}.db")))
    };
    let whole = run((0, u32::MAX), "whole");
    assert_eq!(whole, reduce_expected(&docs));
    let low = run(HALVES[0], "low");
    let high = run(HALVES[1], "high");
    for ((begin, end), shard) in HALVES.iter().zip([&low, &high]) {
        assert!(
            shard.len() > 500,
            "a half holds {} of 2000 keys",
            shard.len()
        );
        for user in shard.keys() {
            let hash = hash_of(user);
            assert!(
                (*begin..=*end).contains(&hash),
                "{user} ({hash:08x}) in {begin:08x}-{end:08x}"
            );
        }
    }
    let mut union = low.clone();
    for (user, row) in high {
        assert!(
            union.insert(user.clone(), row).is_none(),
            "{user} in both shards"
        );
    }
    assert_eq!(union, whole);
}

/// Two shards (the halves) of one pipeline over `docs` into one table of a schema of
/// their own, applied once: the schema guard, the folder, the two pipeline files.
fn postgres_halves(
    tag: &str,
    docs: &[serde_json::Value],
) -> (Schema, tempfile::TempDir, Vec<std::path::PathBuf>) {
    let schema = Schema::new(&format!("shards_{tag}"));
    let dir = tempfile::tempdir().unwrap();
    write_lines(&dir.path().join("views.jsonl"), docs);
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let pipelines: Vec<_> = HALVES
        .iter()
        .zip(["low", "high"])
        .map(|(range, name)| write_pipeline(dir.path(), &endpoint, *range, name))
        .collect();
    // One apply creates the table both shards write.
    let applied = Command::new(SLUICE)
        .arg("apply")
        .arg(&pipelines[0])
        .output();
    assert_success(&applied.unwrap());
    (schema, dir, pipelines)
}

/// Both halves run at once, each SIGKILLed at a moment of its own and restarted, until
/// both have run to the end: the table is the reduction, no key written twice.
#[test]
fn two_shards_killed_again_and_again_at_once_end_exact() {
    let docs = generate(40_000, 4_000, 13);
    let (schema, _dir, pipelines) = postgres_halves("kills", &docs);
    let start = |pipeline: &std::path::PathBuf| {
        Command::new(SLUICE)
            .arg("run")
            .arg(pipeline)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut running: Vec<Option<std::process::Child>> =
        pipelines.iter().map(|p| Some(start(p))).collect();
    let mut kills = 0;
    // A deterministic sequence of waits (10 to 160 ms) between kills.
    let mut wait = 37u64;
    for round in 0..12 {
        wait = (wait * 7 + 13) % 151;
        std::thread::sleep(std::time::Duration::from_millis(10 + wait));
        let shard = round % 2;
        if let Some(mut child) = running[shard].take() {
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap();
                kills += 1;
            }
            child.wait().unwrap();
            running[shard] = Some(start(&pipelines[shard]));
        }
    }
    for child in running.iter_mut().flatten() {
        child.wait().unwrap();
    }
    // Each run once more to its end: what a kill interrupted is recovered.
    for pipeline in &pipelines {
        let out = Command::new(SLUICE)
            .arg("run")
            .arg(pipeline)
            .output()
            .unwrap();
        assert_success(&out);
    }
    assert!(kills > 0, "no run was killed");
    assert_eq!(
        postgres_table(&schema.0),
        reduce_expected(&docs),
        "after {kills} kills"
    );
}

#[test]
fn two_shards_at_once_into_one_postgres_table_end_exact() {
    let docs = generate(30_000, 3_000, 12);
    let (schema, _dir, pipelines) = postgres_halves("once", &docs);
    let children: Vec<_> = pipelines
        .iter()
        .map(|p| Command::new(SLUICE).arg("run").arg(p).spawn().unwrap())
        .collect();
    for child in children {
        assert_success(&child.wait_with_output().unwrap());
    }
    assert_eq!(postgres_table(&schema.0), reduce_expected(&docs));
}
