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

/// The generated input and where its segments end.
pub struct Model {
    rng: Rng,
    keys: u64,
    pub docs: Vec<Value>,
    /// Document counts at the end of each segment (the last one is `docs.len()`).
    segments: Vec<usize>,
}

impl Model {
    pub fn new(seed: u64, keys: u64) -> Model {
        Model {
            rng: Rng::new(seed),
            keys: keys.max(1),
            docs: Vec::new(),
            segments: Vec::new(),
        }
    }

    /// Generates `n` more documents as a new segment; returns them, for the input.
    pub fn generate(&mut self, n: usize) -> &[Value] {
        let first = self.docs.len();
        for i in first..first + n {
            let rng = &mut self.rng;
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
                let entry = table.0.entry(key.clone()).or_default();
                entry
                    .fold(doc)
                    .expect("generated documents are well-formed");
                if seen.insert(key) && (delta || entry.rows == 0) {
                    entry.rows += 1;
                }
            }
        }
        table
    }

    pub fn transaction_count(&self, txn_docs: usize) -> usize {
        self.transactions(txn_docs).len()
    }
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
