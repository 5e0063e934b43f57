//! `sluice bench iceberg --mode upsert`: Sluice reducing pageviews into a table that is
//! the view (`mode: upsert`), against pyiceberg's own `Table.upsert`.
//!
//! ```text
//!  run 1: docs pageviews over keys ─▶ sluice run ─▶ upsert table: one row per key
//!  run 2: docs more, the same keys ─▶ sluice run ─▶ every row replaced (its key loaded
//!                                                   from the sink's index, the old row
//!                                                   a position delete)
//!  the same input ─▶ upsert.py: reduce each round in Python, Table.upsert
//! ```
//!
//! Each run is one transaction (`max_docs` the run's documents, no duration bound), so
//! each epoch holds every key: the large epoch whose memory `--memory-budget` (64 MiB
//! by default) must bound. Figures: `upsert_rows_per_sec` (documents in over the seconds of both
//! Sluice runs, start to exit), `files_after` (data and delete files of the table's
//! current snapshot), `files_after_maintain` (the same after `sluice maintain`),
//! `ratio_pyiceberg_upsert` (pyiceberg's time over Sluice's, from its first line read to
//! its last committed upsert), `peak_rss_bytes` (the larger of the two runs' VmHWM).
//! `exact`: the table, read by pyiceberg, holds one row per key of the input and its
//! views add up to the input's (before and after maintenance); pyiceberg's table too.

use super::{IcebergArgs, SEED, append_pageviews, in_folder, progress};
use crate::loads::sluice_run;
use anyhow::{Context, ensure};
use serde_json::{Value, json};
use sluice_datagen::pageview;
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

/// The baseline's script, and the bench's reader of tables (`inspect`).
const UPSERT_PY: &str = include_str!("upsert.py");
/// What `peak_rss_bytes` should stay under.
const PEAK_RSS_TARGET: u64 = 400 << 20;

/// What the bench measured.
struct Figures {
    /// Both Sluice runs, start to exit.
    sluice_secs: f64,
    peak_rss_bytes: u64,
    files_after: u64,
    /// `None`: this `sluice` has no `maintain` command.
    files_after_maintain: Option<u64>,
    /// `None`: `--no-pyiceberg`.
    pyiceberg_secs: Option<f64>,
    rows: u64,
    exact: bool,
}

/// A table's current snapshot, as pyiceberg reads it (`upsert.py inspect`).
#[derive(Debug, PartialEq)]
struct Inspected {
    rows: u64,
    views: i64,
    files: u64,
}

pub fn run(args: &IcebergArgs) -> anyhow::Result<()> {
    let f = in_folder(args, measure)?;
    let docs = 2 * args.docs;
    let rows_per_sec = docs as f64 / f.sluice_secs;
    let ratio = f.pyiceberg_secs.map(|py| py / f.sluice_secs);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        println!(
            "{}",
            json!({
                "mode": "upsert",
                "docs": docs,
                "keys": args.keys,
                "rows": f.rows,
                "cores": cores,
                "memory_budget": args.memory_budget,
                "sluice_secs": f.sluice_secs,
                "upsert_rows_per_sec": rows_per_sec,
                "files_after": f.files_after,
                "files_after_maintain": f.files_after_maintain,
                "pyiceberg_secs": f.pyiceberg_secs,
                "ratio_pyiceberg_upsert": ratio,
                "peak_rss_bytes": f.peak_rss_bytes,
                "exact": f.exact,
            })
        );
    } else {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        println!(
            "{docs} documents over {} keys, in two runs → {} rows, {cores} cores, \
             memory_budget {}",
            args.keys, f.rows, args.memory_budget
        );
        println!(
            "  sluice upsert {rows_per_sec:>10.0} docs/s ({:.2} s), peak RSS {:.0} MiB \
             (target < {:.0})",
            f.sluice_secs,
            mib(f.peak_rss_bytes),
            mib(PEAK_RSS_TARGET)
        );
        let maintained = f
            .files_after_maintain
            .map_or("n/a".into(), |n| n.to_string());
        println!(
            "  files {} (after sluice maintain: {maintained})",
            f.files_after
        );
        if let (Some(py), Some(ratio)) = (f.pyiceberg_secs, ratio) {
            println!(
                "  pyiceberg upsert {py:.2} s, ratio_pyiceberg_upsert {ratio:.2} (target ≥ 3)"
            );
        }
        println!("  exact: {}", f.exact);
    }
    ensure!(f.exact, "the tables do not hold the input's reduction");
    Ok(())
}

fn measure(args: &IcebergArgs, dir: &Path) -> anyhow::Result<Figures> {
    let input = dir.join("pageviews.jsonl");
    let pipeline = dir.join("pipeline.yaml");
    std::fs::write(&pipeline, pipeline_yaml(&input, args))?;
    std::fs::write(dir.join("upsert.py"), UPSERT_PY)?;
    let mut views = 0;
    let mut sluice_secs = 0.0;
    let mut peak_rss_bytes = 0;
    for run in 0..2 {
        let seqs = run * args.docs..(run + 1) * args.docs;
        progress(args, format!("run {}: {} documents", run + 1, args.docs));
        views += append_pageviews(&input, seqs, args.keys)?;
        let measured = sluice_run(&pipeline, &dir.join(format!("run-{}.log", run + 1)))?;
        sluice_secs += measured.elapsed.as_secs_f64();
        peak_rss_bytes = peak_rss_bytes.max(measured.peak_rss_bytes);
    }
    let keys = distinct_keys(2 * args.docs, args.keys);
    let table = |dir: &Path| inspect(dir, "sluice", "catalog.db", "warehouse", "sluice.pageviews");
    let after = table(dir)?;
    let mut exact = after.rows == keys && after.views == views;
    let files_after_maintain = match maintain(args, dir, &pipeline)? {
        None => None,
        Some(()) => {
            let maintained = table(dir)?;
            exact &= (maintained.rows, maintained.views) == (after.rows, after.views);
            Some(maintained.files)
        }
    };
    let pyiceberg_secs = match args.no_pyiceberg {
        true => None,
        false => {
            progress(
                args,
                "pyiceberg: the same rounds, reduced in Python, upserted",
            );
            let (secs, py) = pyiceberg_upsert(dir, &input, args.docs)?;
            exact &= py.rows == keys && py.views == views;
            Some(secs)
        }
    };
    Ok(Figures {
        sluice_secs,
        peak_rss_bytes,
        files_after: after.files,
        files_after_maintain,
        pyiceberg_secs,
        rows: after.rows,
        exact,
    })
}

/// The pipeline: the input file into an upsert table, each run one transaction, under
/// the combiners' `--memory-budget`.
fn pipeline_yaml(input: &Path, args: &IcebergArgs) -> String {
    format!(
        "{collection}sources:
  file:
    target: bench/pageviews
    file: {{path: {input}, format: json}}
materializations:
  lake:
    endpoint:
      iceberg: {{catalog: catalog.db, warehouse: warehouse}}
    bindings:
      - source: bench/pageviews
        resource: {{table: pageviews, mode: upsert}}
runtime:
  memory_budget: {budget}
  transactions: {{max_docs: {docs}, max_bytes: {max_bytes}, max_duration: 1h, min_duration: 1h}}
",
        collection = crate::sql::PAGEVIEWS_COLLECTION,
        input = json!(input.to_string_lossy()),
        budget = json!(args.memory_budget),
        docs = args.docs,
        // Far above the run's input: documents, not bytes, close its one transaction.
        max_bytes = 64u64 << 30,
    )
}

/// How many keys the first `docs` pageviews hold.
fn distinct_keys(docs: u64, keys: u64) -> u64 {
    let seen: HashSet<u64> = (0..docs).map(|seq| pageview(SEED, keys, seq).key).collect();
    seen.len() as u64
}

/// `sluice maintain <pipeline>`, if this `sluice` has the command (`None` if not).
fn maintain(args: &IcebergArgs, dir: &Path, pipeline: &Path) -> anyhow::Result<Option<()>> {
    let sluice = sluice_app::sibling::sibling("sluice")?;
    let has_maintain = Command::new(&sluice)
        .args(["maintain", "--help"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_maintain {
        eprintln!(
            "{} has no maintain command: files_after_maintain is null",
            sluice.display()
        );
        return Ok(None);
    }
    progress(args, "sluice maintain");
    let out = Command::new(&sluice)
        .arg("maintain")
        .arg(pipeline)
        .current_dir(dir)
        .output()
        .context("running sluice maintain")?;
    ensure!(
        out.status.success(),
        "sluice maintain failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Some(()))
}

/// pyiceberg's upsert of the same input in rounds of `docs`: its seconds, and its table.
fn pyiceberg_upsert(dir: &Path, input: &Path, docs: u64) -> anyhow::Result<(f64, Inspected)> {
    let out = python(
        dir,
        &[
            "upsert".as_ref(),
            input.as_os_str(),
            docs.to_string().as_ref(),
            dir.join("py-catalog.db").as_os_str(),
            dir.join("py-warehouse").as_os_str(),
        ],
    )?;
    ensure!(
        out["docs"].as_u64() == Some(2 * docs),
        "pyiceberg read {} documents, not {}",
        out["docs"],
        2 * docs
    );
    let secs = out["secs"].as_f64().context("secs")?;
    let table = inspect(
        dir,
        "bench",
        "py-catalog.db",
        "py-warehouse",
        "bench.pageviews",
    )?;
    Ok((secs, table))
}

/// A table of the catalog `catalog` (a file in `dir`, of catalog name `name`) over the
/// warehouse `warehouse` (a folder in `dir`), as pyiceberg reads it.
fn inspect(
    dir: &Path,
    name: &str,
    catalog: &str,
    warehouse: &str,
    ident: &str,
) -> anyhow::Result<Inspected> {
    let out = python(
        dir,
        &[
            "inspect".as_ref(),
            name.as_ref(),
            dir.join(catalog).as_os_str(),
            dir.join(warehouse).as_os_str(),
            ident.as_ref(),
        ],
    )?;
    let number = |name: &str| {
        out[name]
            .as_u64()
            .with_context(|| format!("{name} in {out}"))
    };
    Ok(Inspected {
        rows: number("rows")?,
        views: out["views"].as_i64().context("views")?,
        files: number("data_files")? + number("delete_files")?,
    })
}

/// `python3 upsert.py <args>` in `dir`: the JSON object it prints.
fn python(dir: &Path, args: &[&std::ffi::OsStr]) -> anyhow::Result<Value> {
    let out = Command::new("python3")
        .arg(dir.join("upsert.py"))
        .args(args)
        .output()
        .context("running python3")?;
    ensure!(
        out.status.success(),
        "upsert.py {:?} failed (is pyiceberg[sql-sqlite,pyarrow] installed?): {}",
        args.first(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("pyiceberg printed {}", String::from_utf8_lossy(&out.stdout)))
}
