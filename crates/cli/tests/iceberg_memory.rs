//! A large epoch of an Iceberg upsert table stays within its memory bound: `sluice bench
//! iceberg --mode upsert` at a small scale (Sluice only, no pyiceberg baseline), each of
//! its two runs one transaction holding every key, the second loading and replacing
//! every row. Checked for an exact table and a peak resident set under a fixed bound
//! (the combiners' four budgets, and the rest of the process). Memory, not time: no
//! figure here is a duration.

use crate::common;

#[test]
fn a_large_upsert_epoch_stays_within_its_memory_bound_and_is_exact() {
    let (docs, keys) = (300_000.to_string(), 150_000.to_string());
    let figures = common::exact_bench_figures(&[
        "iceberg",
        "--mode",
        "upsert",
        "--no-pyiceberg",
        "--docs",
        &docs,
        "--keys",
        &keys,
    ]);
    let peak = figures["peak_rss_bytes"].as_u64().expect("a peak RSS");
    // The bound for `memory_budget: 64MiB`: the combiners' documents may take up
    // to four budgets (256 MiB, the runtime's own ceiling, `memory_budget`'s docs), and
    // 144 MiB is left for the rest: the process, the index's SQLite cache, one batch and
    // the Parquet writer's open row group, and the epoch's delete positions (about 200
    // bytes per replaced row, the one part that grows with the epoch: ~30 MB here).
    // Measured: 227 MiB in a debug build (197 MiB at a 16 MiB budget), 258 MiB in
    // release at the bench's full size (1M documents, 200 000 keys per run).
    let bound: u64 = 400 << 20;
    assert!(
        peak < bound,
        "peak RSS {} MiB, over the bound of {} MiB: {figures}",
        peak >> 20,
        bound >> 20
    );
}
