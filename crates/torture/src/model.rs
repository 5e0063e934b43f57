//! The independent model: generated documents, their expected reduction (computed here,
//! without Sluice's reducers), and the comparison of a store's rows with it.
//!
//! Documents `{key, views, bytes, last_seen, attrs: {aN: int}}` reduce by `merge`:
//! `views` and `bytes` are summed, `last_seen` and every `attrs` property maximized.
//! Every reduction is commutative, so delta-update rows can be re-reduced in any
//! order. `views` is never zero, so a lost or doubled document always changes a sum.
//!
//! Transaction bounds are deterministic (the pipeline closes a transaction at
//! `txn_docs` documents or at the end of the input), so the model also knows how many
//! delta rows each key must have: one per transaction of the input that holds it.
//! Input is appended in segments, each written only after everything before it has
//! committed, so transactions never straddle two segments.
//!
//! With deletions (a model of [`Model::with_deletions`]: a store holding the view, read
//! from an input that keeps its order), one document in [`DELETE_ONE_IN`] is a deletion
//! `{key, _meta: {op: "d"}}` instead: it removes the key's row, and the key's documents
//! after it, in the same transaction or later, reduce from nothing again. A deleted key
//! must then be absent from the store, and a recreated one hold only what came after.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// A small deterministic generator (SplitMix64): the same seed, the same torture.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The reduction of one key, expected or found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reduced {
    pub views: i64,
    pub bytes: i64,
    pub last_seen: String,
    pub attrs: BTreeMap<String, i64>,
    /// Rows in the table: 1 for a standard binding, one per transaction for delta.
    pub rows: u64,
}

impl Reduced {
    /// Folds one document (a generated one, or a stored row) into the reduction.
    fn fold(&mut self, doc: &Value) -> Result<(), String> {
        let int = |ptr: &str| {
            doc.pointer(ptr)
                .and_then(Value::as_i64)
                .ok_or_else(|| format!("{ptr} is not an integer in {doc}"))
        };
        self.views += int("/views")?;
        self.bytes += int("/bytes")?;
        let seen = doc["last_seen"]
            .as_str()
            .ok_or_else(|| format!("/last_seen is not a string in {doc}"))?;
        if seen > self.last_seen.as_str() {
            self.last_seen = seen.to_string();
        }
        if let Some(attrs) = doc["attrs"].as_object() {
            for (name, value) in attrs {
                let value = value
                    .as_i64()
                    .ok_or_else(|| format!("/attrs/{name} is not an integer in {doc}"))?;
                let slot = self.attrs.entry(name.clone()).or_insert(value);
                *slot = (*slot).max(value);
            }
        }
        Ok(())
    }
}

/// One document in this many is a deletion, in a model with deletions: with the
/// tortures' ten or so documents per key, about half the keys are deleted at least once,
/// some for good (absent at the end), most recreated after.
pub const DELETE_ONE_IN: u64 = 20;

/// The generated input and where its segments end.
pub struct Model {
    rng: Rng,
    keys: u64,
    /// Whether some documents are deletions.
    deletions: bool,
    pub docs: Vec<Value>,
    /// Document counts at the end of each segment (the last one is `docs.len()`).
    segments: Vec<usize>,
}

impl Model {
    pub fn new(seed: u64, keys: u64) -> Model {
        Model {
            rng: Rng::new(seed),
            keys: keys.max(1),
            deletions: false,
            docs: Vec::new(),
            segments: Vec::new(),
        }
    }

    /// The same model, one document in [`DELETE_ONE_IN`] a deletion (a standard
    /// binding's view only: the stores' delta rows and the outputs' checks do not
    /// model them).
    pub fn with_deletions(self) -> Model {
        Model {
            deletions: true,
            ..self
        }
    }

    /// Generates `n` more documents as a new segment; returns them, for the input.
    pub fn generate(&mut self, n: usize) -> &[Value] {
        let first = self.docs.len();
        for i in first..first + n {
            let rng = &mut self.rng;
            if self.deletions && rng.below(DELETE_ONE_IN) == 0 {
                let key = format!("k{:06}", rng.below(self.keys));
                self.docs
                    .push(json!({ "key": key, "_meta": { "op": "d" } }));
                continue;
            }
            let mut attrs = serde_json::Map::new();
            for _ in 0..rng.below(3) {
                attrs.insert(format!("a{}", rng.below(5)), json!(rng.below(1000)));
            }
            self.docs.push(json!({
                "key": format!("k{:06}", rng.below(self.keys)),
                "views": 1 + rng.below(9),
                "bytes": rng.below(5000),
                "last_seen": format!("2026-{:02}-{:02}T{:02}:{:02}Z",
                    1 + rng.below(12), 1 + rng.below(28), rng.below(24), i % 60),
                "attrs": attrs,
            }));
        }
        self.segments.push(self.docs.len());
        &self.docs[first..]
    }

    /// The transactions of the input: `[begin, end)` document ranges.
    fn transactions(&self, txn_docs: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut begin = 0;
        for &end in &self.segments {
            while begin < end {
                let next = (begin + txn_docs).min(end);
                out.push((begin, next));
                begin = next;
            }
        }
        out
    }

    /// The expected table after the first `transactions` transactions committed.
    pub fn expected(&self, txn_docs: usize, delta: bool, transactions: usize) -> Table {
        let mut table = Table::default();
        for (begin, end) in self.transactions(txn_docs).into_iter().take(transactions) {
            let mut seen = BTreeSet::new();
            for doc in &self.docs[begin..end] {
                let key = doc["key"].as_str().expect("generated key").to_string();
                if is_deletion(doc) {
                    table.0.remove(&key);
                    continue;
                }
                let entry = table.0.entry(key.clone()).or_default();
                entry
                    .fold(doc)
                    .expect("generated documents are well-formed");
                match delta {
                    true if seen.insert(key) => entry.rows += 1,
                    true => {}
                    false => entry.rows = 1,
                }
            }
        }
        table
    }

    pub fn transaction_count(&self, txn_docs: usize) -> usize {
        self.transactions(txn_docs).len()
    }
}

/// Whether a generated document is a deletion of its key.
fn is_deletion(doc: &Value) -> bool {
    doc.pointer("/_meta/op").and_then(Value::as_str) == Some("d")
}

/// Key → reduction: what a table holds, re-reduced per key.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Table(pub BTreeMap<String, Reduced>);

impl Table {
    /// Re-reduces a store's rows (each row's stored document), counting rows per key.
    pub fn from_rows(rows: &[Value]) -> Result<Table, String> {
        let mut table = Table::default();
        for doc in rows {
            let key = doc["key"]
                .as_str()
                .ok_or_else(|| format!("a stored document has no key: {doc}"))?;
            let entry = table.0.entry(key.to_string()).or_default();
            entry.fold(doc)?;
            entry.rows += 1;
        }
        Ok(table)
    }

    pub fn rows(&self) -> u64 {
        self.0.values().map(|r| r.rows).sum()
    }
}

/// How a found table differs from the expected one, in keys.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub rows_expected: u64,
    pub rows_found: u64,
    /// Keys missing, or with fewer rows or smaller sums than expected.
    pub lost: u64,
    /// Keys with more rows or larger sums than expected.
    pub duplicated: u64,
    /// Keys unexpected, with wrong maximized values, or both short and over.
    pub mismatched: u64,
}

impl Verdict {
    pub fn exact(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.mismatched == 0
    }
}

/// Compares key by key.
pub fn compare(expected: &Table, found: &Table) -> Verdict {
    let mut verdict = Verdict {
        rows_expected: expected.rows(),
        rows_found: found.rows(),
        ..Verdict::default()
    };
    for (key, want) in &expected.0 {
        let Some(got) = found.0.get(key) else {
            verdict.lost += 1;
            continue;
        };
        let pairs = [
            (got.rows as i64, want.rows as i64),
            (got.views, want.views),
            (got.bytes, want.bytes),
        ];
        let short = pairs.iter().any(|(g, w)| g < w);
        let over = pairs.iter().any(|(g, w)| g > w);
        let values_differ = got.last_seen != want.last_seen || got.attrs != want.attrs;
        match (short, over) {
            (true, false) => verdict.lost += 1,
            (false, true) => verdict.duplicated += 1,
            (true, true) => verdict.mismatched += 1,
            (false, false) if values_differ => verdict.mismatched += 1,
            (false, false) => {}
        }
    }
    verdict.mismatched += found
        .0
        .keys()
        .filter(|k| !expected.0.contains_key(*k))
        .count() as u64;
    verdict
}

/// What a store holds, read back (`Store::read`), to be judged against the model.
pub struct Read {
    /// The stored document of every row (an output's: the view its changes fold into).
    pub rows: Vec<Value>,
    /// What is wrong with the store besides its rows: data files of the Iceberg
    /// warehouse that its table does not reference
    /// ([`sluice_iceberg::orphan_data_files`]) or upsert rows whose columns are not their
    /// document's (`IcebergStore::read`), the broken rules of an output's batches
    /// (`output::check`).
    pub violations: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str, views: i64) -> Value {
        json!({"key": key, "views": views, "bytes": 0, "last_seen": "2026", "attrs": {}})
    }

    fn deletion(key: &str) -> Value {
        json!({"key": key, "_meta": {"op": "d"}})
    }

    /// Two transactions of three documents.
    fn model(docs: Vec<Value>) -> Model {
        let segments = vec![docs.len()];
        Model {
            rng: Rng::new(0),
            keys: 2,
            deletions: true,
            docs,
            segments,
        }
    }

    #[test]
    fn a_deletion_removes_the_key_and_what_follows_reduces_from_nothing() {
        let m = model(vec![
            doc("a", 1),
            doc("b", 1),
            deletion("a"),
            doc("b", 2),
            doc("a", 5),
            deletion("b"),
        ]);
        let after_first = m.expected(3, false, 1);
        assert_eq!(after_first.0.keys().collect::<Vec<_>>(), ["b"]);
        let all = m.expected(3, false, 2);
        assert_eq!(
            all.0.keys().collect::<Vec<_>>(),
            ["a"],
            "b deleted for good"
        );
        assert_eq!((all.0["a"].views, all.0["a"].rows), (5, 1));
    }

    #[test]
    fn generated_deletions_are_about_one_in_twenty_and_absent_without_them() {
        let mut with = Model::new(3, 50).with_deletions();
        let deleted = with
            .generate(4_000)
            .iter()
            .filter(|d| is_deletion(d))
            .count();
        assert!((100..300).contains(&deleted), "{deleted} deletions");
        let mut without = Model::new(3, 50);
        assert!(!without.generate(4_000).iter().any(is_deletion));
    }
}
