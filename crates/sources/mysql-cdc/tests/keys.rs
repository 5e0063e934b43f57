//! The snapshot chunked by every kind of primary key, in the server's order: text in a
//! case- and accent-insensitive collation (`'a' < 'àz' < 'B' < 'c' < 'D'`, where bytes
//! put `'B'` and `'D'` first and `'àz'` last), a composite (text, integer) key whose
//! texts are equal in the collation, binary keys, decimals wider than a double,
//! date-times with fractions, an `ENUM` (ordered by its members' numbers) and a mixed
//! composite key. Each table is read in chunks of 3 while it is written, the reader
//! crashes after its second chunk and a new one resumes from the journaled bound while
//! it is written again: every row is read once in the server's order, every change
//! arrives exactly once (a key's `v` only grows), and the rows fold to the table.

mod common;

use common::*;
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_source_sdk::Source;
use sluice_testkit::mariadb::BinlogMariadb;
use std::collections::BTreeMap;

/// A table keyed by `key`, with a `BIGINT v` each write sets anew; `rows` its keys as
/// SQL literals in the server's key order, `json` the same keys as their documents
/// show them, and `extra` a key the test inserts, right after row `extra_after` (5 or
/// later: ahead of the bound of the crash).
struct Case {
    table: &'static str,
    key: &'static [&'static str],
    columns: &'static str,
    rows: [&'static str; 9],
    json: Value,
    extra: &'static str,
    extra_json: Value,
    extra_after: usize,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            table: "names",
            key: &["name"],
            columns: "name VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
            rows: [
                "'a'",
                "'àz'",
                "'B'",
                "'bb'",
                "'BC'",
                "'c'",
                "'D'",
                "'éclair'",
                "'eel'",
            ],
            json: json!([
                ["a"],
                ["àz"],
                ["B"],
                ["bb"],
                ["BC"],
                ["c"],
                ["D"],
                ["éclair"],
                ["eel"]
            ]),
            extra: "'Dz'",
            extra_json: json!(["Dz"]),
            extra_after: 6,
        },
        Case {
            table: "pairs",
            key: &["name", "n"],
            columns: "name VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci, n INT",
            rows: [
                "'a', 1", "'àz', 5", "'B', 1", "'B', 2", "'b', 3", "'c', 1", "'D', 0", "'D', 7",
                "'e', 1",
            ],
            json: json!([
                ["a", 1],
                ["àz", 5],
                ["B", 1],
                ["B", 2],
                ["b", 3],
                ["c", 1],
                ["D", 0],
                ["D", 7],
                ["e", 1]
            ]),
            extra: "'d', 3",
            extra_json: json!(["d", 3]),
            extra_after: 6,
        },
        Case {
            table: "bytes",
            key: &["b"],
            columns: "b VARBINARY(8)",
            rows: [
                "x''", "x'00'", "x'0000'", "x'01'", "x'7f'", "x'80'", "x'80ff'", "x'ff'", "x'ff00'",
            ],
            json: json!([
                [""],
                ["AA=="],
                ["AAA="],
                ["AQ=="],
                ["fw=="],
                ["gA=="],
                ["gP8="],
                ["/w=="],
                ["/wA="]
            ]),
            extra: "x'fe'",
            extra_json: json!(["/g=="]),
            extra_after: 6,
        },
        Case {
            table: "amounts",
            key: &["d"],
            columns: "d DECIMAL(30,10)",
            rows: [
                "-12.5",
                "-1",
                "0",
                "0.0000000001",
                "2",
                "9.5",
                "10",
                "12345678901234567890.5",
                "99999999999999999999.9999999999",
            ],
            json: json!([
                [-12.5],
                [-1],
                [0],
                [0.0000000001],
                [2],
                [9.5],
                [10],
                ["12345678901234567890.5000000000"],
                ["99999999999999999999.9999999999"]
            ]),
            extra: "9.75",
            extra_json: json!([9.75]),
            extra_after: 5,
        },
        Case {
            table: "times",
            key: &["t"],
            columns: "t DATETIME(6)",
            rows: [
                "'1000-01-01 00:00:00'",
                "'1969-12-31 23:59:59.999999'",
                "'2024-01-01 00:00:00'",
                "'2024-01-01 00:00:00.000001'",
                "'2024-01-01 00:00:00.5'",
                "'2024-02-29 12:00:00'",
                "'2024-02-29 12:00:00.25'",
                "'2030-01-01 00:00:00'",
                "'9999-12-31 23:59:59.999999'",
            ],
            json: json!([
                ["1000-01-01T00:00:00"],
                ["1969-12-31T23:59:59.999999"],
                ["2024-01-01T00:00:00"],
                ["2024-01-01T00:00:00.000001"],
                ["2024-01-01T00:00:00.5"],
                ["2024-02-29T12:00:00"],
                ["2024-02-29T12:00:00.25"],
                ["2030-01-01T00:00:00"],
                ["9999-12-31T23:59:59.999999"]
            ]),
            extra: "'2024-02-29 12:00:00.125'",
            extra_json: json!(["2024-02-29T12:00:00.125"]),
            extra_after: 5,
        },
        Case {
            table: "sizes",
            key: &["s"],
            columns: "s ENUM('z','y','x','w','v','u','t','s','r','q')",
            rows: [
                "'z'", "'y'", "'x'", "'w'", "'v'", "'u'", "'t'", "'s'", "'r'",
            ],
            json: json!([
                ["z"],
                ["y"],
                ["x"],
                ["w"],
                ["v"],
                ["u"],
                ["t"],
                ["s"],
                ["r"]
            ]),
            extra: "'q'",
            extra_json: json!(["q"]),
            extra_after: 8,
        },
        Case {
            table: "mixed",
            key: &["day", "amount", "tag"],
            columns: "day DATE, amount DECIMAL(6,2), tag VARBINARY(4)",
            rows: [
                "'2023-12-31', 0, x''",
                "'2024-01-01', 9.5, x'ff'",
                "'2024-01-01', 10, x''",
                "'2024-01-01', 10, x'00'",
                "'2024-01-01', 10, x'0000'",
                "'2024-01-01', 10, x'01'",
                "'2024-01-01', 100, x''",
                "'2024-01-02', -1, x'ff'",
                "'2024-01-02', -0.5, x''",
            ],
            json: json!([
                ["2023-12-31", 0, ""],
                ["2024-01-01", 9.5, "/w=="],
                ["2024-01-01", 10, ""],
                ["2024-01-01", 10, "AA=="],
                ["2024-01-01", 10, "AAA="],
                ["2024-01-01", 10, "AQ=="],
                ["2024-01-01", 100, ""],
                ["2024-01-02", -1, "/w=="],
                ["2024-01-02", -0.5, ""]
            ]),
            extra: "'2024-01-01', 10, x'02'",
            extra_json: json!(["2024-01-01", 10, "Ag=="]),
            extra_after: 5,
        },
    ]
}

impl Case {
    fn name(&self) -> String {
        format!("k.{}", self.table)
    }

    fn key_of(&self, doc: &Value) -> Value {
        Value::Array(self.key.iter().map(|k| doc[*k].clone()).collect())
    }

    fn set_v(&self, row: &str, v: u64) -> String {
        format!(
            "UPDATE {} SET v = {v} WHERE ({}) = ({row});",
            self.name(),
            self.key.join(", ")
        )
    }

    fn delete(&self, row: &str) -> String {
        format!(
            "DELETE FROM {} WHERE ({}) = ({row});",
            self.name(),
            self.key.join(", ")
        )
    }

    fn insert(&self, row: &str, v: u64) -> String {
        format!("INSERT INTO {} VALUES ({row}, {v});", self.name())
    }

    /// The keys the resumed snapshot reads, in order: rows 6 on, but those deleted
    /// before it (7 and 8), with the extra key.
    fn resumed_reads(&self) -> Vec<Value> {
        let row6 = self.json[6].clone();
        match self.extra_after {
            5 => vec![self.extra_json.clone(), row6],
            _ => vec![row6, self.extra_json.clone()],
        }
    }
}

#[tokio::test]
async fn every_kind_of_key_is_chunked_in_the_servers_order_and_resumes_exactly() {
    let server = BinlogMariadb::start();
    let mut conn = sql(&server).await;
    conn.query_drop("CREATE DATABASE k").await.unwrap();
    for case in cases() {
        let table = case.name();
        conn.query_drop(format!(
            "CREATE TABLE {table} ({}, v BIGINT, PRIMARY KEY ({}))",
            case.columns,
            case.key.join(", ")
        ))
        .await
        .unwrap();
        let inserts: String = (case.rows.iter().zip(1..))
            .map(|(row, v)| case.insert(row, v))
            .collect();
        conn.query_drop(inserts).await.unwrap();
        let r = &case.rows;
        let config = config(&server, &[table.as_str()]);
        let mut first = source(&config);
        let (mut docs, _) = step(&mut first, 3).await;
        // Written while the first reader reads: behind its bound, ahead of it.
        let writes = [
            case.set_v(r[1], 101),
            case.set_v(r[4], 102),
            case.delete(r[7]),
        ];
        conn.query_drop(writes.concat()).await.unwrap();
        let (second, committed) = step(&mut first, 3).await;
        docs.extend(second);
        drop(first);
        let keys: Vec<Value> = docs.iter().map(|d| case.key_of(d)).collect();
        assert_eq!(
            keys,
            case.json.as_array().unwrap()[..6],
            "{table}: {docs:?}"
        );
        // While no one reads: rows 1 and 6 are where bytes and the server's order
        // disagree about the bound (row 5).
        let writes = [
            case.set_v(r[1], 201),
            case.set_v(r[5], 202),
            case.set_v(r[6], 203),
            case.delete(r[8]),
            case.insert(case.extra, 204),
        ];
        conn.query_drop(writes.concat()).await.unwrap();
        let mut resumed = source(&config);
        resumed.seek(&position(&committed)).await.unwrap();
        let (from, mut steps) = (docs.len(), Vec::new());
        until(&mut resumed, 3, &mut docs, &mut steps, caught_up).await;
        let reads: Vec<Value> = docs[from..]
            .iter()
            .filter(|d| d["_meta"]["op"] == "r")
            .map(|d| case.key_of(d))
            .collect();
        assert_eq!(reads, case.resumed_reads(), "{table}: {docs:?}");
        let writes = [
            case.set_v(r[0], 301),
            case.set_v(r[6], 302),
            case.delete(r[3]),
            case.set_v(case.extra, 303),
        ];
        conn.query_drop(writes.concat()).await.unwrap();
        let want = whole_table(&server, &case).await;
        until(&mut resumed, 10, &mut docs, &mut steps, |d, _| {
            fold_by(d, |doc| case.key_of(doc).to_string()) == want
        })
        .await;
        each_change_once(&case, &docs);
    }
}

/// The table now, read by a new source's snapshot in one chunk (it never streams, so
/// it does not take the replica id of the source under test).
async fn whole_table(server: &BinlogMariadb, case: &Case) -> BTreeMap<String, Value> {
    let mut config = config(server, &[case.name().as_str()]);
    config.chunk_rows = 1000;
    let (docs, _) = step(&mut source(&config), 1000).await;
    fold_by(&docs, |doc| case.key_of(doc).to_string())
}

/// Every write set `v` anew, higher than any before: a key's documents show it
/// growing, a delete the value it deletes. A change read twice (in a snapshot and
/// again from the log) would show a `v` again.
fn each_change_once(case: &Case, docs: &[Value]) {
    let mut last: BTreeMap<String, (u64, &str)> = BTreeMap::new();
    for doc in docs {
        let key = case.key_of(doc).to_string();
        let (v, op) = (
            doc["v"].as_u64().unwrap(),
            doc["_meta"]["op"].as_str().unwrap(),
        );
        if let Some(&(before, before_op)) = last.get(&key) {
            let fine = match op {
                "d" => v == before && before_op != "d",
                _ => v > before,
            };
            assert!(
                fine,
                "{}: {key} {op} v={v} after {before_op} v={before}: {docs:?}",
                case.name()
            );
        }
        last.insert(key, (v, op));
    }
}
