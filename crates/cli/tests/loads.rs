//! A transaction that loads every key of a large PostgreSQL table holds at most its
//! budgets of them (the README's memory bound): `sluice bench loads` at a small scale,
//! checked for an exact table and a peak resident set far below what holding the
//! loaded documents would take. Memory, not time: no figure here is a duration.

use crate::common;

#[test]
fn loading_a_whole_table_stays_within_the_memory_budget_and_is_exact() {
    let keys: u64 = 60_000;
    let payload_bytes: u64 = 2_000;
    let figures = common::exact_bench_figures(&[
        "loads",
        "--memory-budget",
        "4MiB",
        "--keys",
        &keys.to_string(),
        "--payload-bytes",
        &payload_bytes.to_string(),
    ]);
    // The second run loads all 60 000 documents (about 120 MB of JSON text, more as
    // parsed documents) in one transaction; the first loads nothing. Within the bound
    // the second holds four 4 MiB budgets and the messages in flight beyond what the
    // first holds; holding the loaded documents whole, in the runtime or in the driver,
    // takes at least their text again. So the growth of the peak, not the peak itself
    // (the process's own size moves with the binary), is what is bounded here.
    let loaded_text = keys * (payload_bytes + 40);
    let peak = |run: &str| figures[run].as_u64().expect("a peak RSS");
    let (first, second) = (peak("first_peak_rss_bytes"), peak("second_peak_rss_bytes"));
    assert!(
        second.saturating_sub(first) < loaded_text / 2,
        "loading {loaded_text} bytes of documents raised the peak RSS from {first} to \
         {second} bytes: {figures}"
    );
}
