//! Shards split a materialization by key hash: each reads the whole input and keeps the
//! documents whose key hashes into its range (`shard: {key_begin, key_end}`). Two shards
//! over the two halves write disjoint keys, each in its range, whose union is what one
//! shard over every key writes; run at once into one PostgreSQL table, they end exact.

mod common;

use common::{
    POSTGRES_URL, Row, SLUICE, assert_success, generate, pipeline_yaml, postgres, reduce_expected,
    sqlite_table, write_lines,
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

#[test]
fn two_shards_at_once_into_one_postgres_table_end_exact() {
    let schema = format!("sluice_shards_{}", std::process::id());
    let create = format!(r#"DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}""#);
    postgres(async |c| c.batch_execute(&create).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(30_000, 3_000, 12);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let endpoint = format!("postgres: {{url: \"{POSTGRES_URL}\", schema: {schema}}}");
    let pipelines: Vec<_> = HALVES
        .iter()
        .zip(["low", "high"])
        .map(|(range, name)| write_pipeline(dir.path(), &endpoint, *range, name))
        .collect();
    // One apply creates the table both shards write.
    let applied = Command::new(SLUICE)
        .arg("apply")
        .arg(&pipelines[0])
        .output()
        .unwrap();
    assert_success(&applied);
    let children: Vec<_> = pipelines
        .iter()
        .map(|p| Command::new(SLUICE).arg("run").arg(p).spawn().unwrap())
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_success(&out);
    }
    let sql =
        format!(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "{schema}"."pageviews""#);
    let rows: Vec<(String, i64, i64, String)> = postgres(async |c| {
        c.query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    });
    let drop = format!(r#"DROP SCHEMA "{schema}" CASCADE"#);
    postgres(async |c| c.batch_execute(&drop).await.unwrap());
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in rows {
        assert!(!table.contains_key(&user), "{user} written twice");
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    assert_eq!(table, reduce_expected(&docs));
}
