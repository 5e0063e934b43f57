//! `sluice bench scale`: what one `sluice run` gains from a second core. The quickstart
//! pipeline (datagen page views reduced per user into SQLite) runs pinned to 1 core and
//! then to 2 cores (`taskset`), from scratch each time, in the same bench run.
//!
//! ```text
//!  for cores in [1, 2]:  fresh folder, `taskset -c 0..cores-1 sluice run pipeline.yaml`
//!  figures: docs_per_sec_{1,2} (input documents over the wall time), cpu_seconds_{1,2}
//!  (the process's user + system time), ratio_2_1, and exact (both tables equal)
//!  then the bound: two processes at once on 2 cores, each over half the documents and
//!  half the keys (one shard each) into tables of one SQLite file: docs_per_sec_split,
//!  ratio_split_1 (what a perfectly partitioned read would reach)
//! ```

use super::loads::{Run, RunningSluice};
use anyhow::{Context, bail, ensure};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ScaleArgs {
    /// Documents of the input.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys (users).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The quickstart's pipeline file (`examples/quickstart/pipeline.yaml`) itself, with the
/// input's size as asked.
fn pipeline_yaml(args: &ScaleArgs) -> anyhow::Result<String> {
    quickstart(&[(
        "documents: 1000000, keys: 100000,",
        &format!("documents: {}, keys: {},", args.docs, args.keys),
    )])
}

/// One half of the split bound's input: `half`'s own materialization and table, half
/// the documents over half the keys, one shard.
fn half_yaml(args: &ScaleArgs, half: &str) -> anyhow::Result<String> {
    quickstart(&[
        (
            "documents: 1000000, keys: 100000,",
            &format!("documents: {}, keys: {},", args.docs / 2, args.keys / 2),
        ),
        ("  views-db:", &format!("  views-{half}:")),
        ("table: pageviews", &format!("table: pv_{half}")),
        ("workers: auto", "workers: 1"),
    ])
}

/// The quickstart's pipeline file with each `(text, replacement)` made.
fn quickstart(replacements: &[(&str, &str)]) -> anyhow::Result<String> {
    const QUICKSTART: &str = include_str!("../../../examples/quickstart/pipeline.yaml");
    let mut yaml = QUICKSTART.to_string();
    for (text, replacement) in replacements {
        ensure!(
            yaml.contains(text),
            "the quickstart's pipeline file no longer reads `{text}`"
        );
        yaml = yaml.replace(text, replacement);
    }
    Ok(yaml)
}

pub fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    ensure!(cores >= 2, "this machine has {cores} core: two are needed");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let work = std::env::temp_dir().join(format!("sluice_scale_{}_{nanos:x}", std::process::id()));
    let result = measure(&args, &work);
    let _ = std::fs::remove_dir_all(&work);
    let (one, two, exact, split) = result?;
    let rate = |run: &Run| args.docs as f64 / run.elapsed.as_secs_f64();
    let (rate_1, rate_2) = (rate(&one), rate(&two));
    let ratio = rate_2 / rate_1;
    let rate_split = (args.docs / 2 * 2) as f64 / split.as_secs_f64();
    if args.json {
        let figures = json!({
            "docs": args.docs,
            "keys": args.keys,
            "cores": cores,
            "docs_per_sec_1": rate_1.round(),
            "docs_per_sec_2": rate_2.round(),
            "ratio_2_1": (ratio * 100.0).round() / 100.0,
            "secs_1": one.elapsed.as_secs_f64(),
            "secs_2": two.elapsed.as_secs_f64(),
            "cpu_seconds_1": one.cpu_seconds,
            "cpu_seconds_2": two.cpu_seconds,
            "docs_per_sec_split": rate_split.round(),
            "ratio_split_1": (rate_split / rate_1 * 100.0).round() / 100.0,
            "exact": exact,
        });
        println!("{figures}");
    } else {
        for (n, run, rate) in [(1, &one, rate_1), (2, &two, rate_2)] {
            println!(
                "{n} core(s): {:.2} s, {rate:.0} docs/s, {:.2} CPU seconds",
                run.elapsed.as_secs_f64(),
                run.cpu_seconds
            );
        }
        println!("ratio 2:1 {ratio:.2} ({cores} cores here); exact: {exact}");
        println!(
            "bound: two processes over pre-split halves, {:.2} s, {rate_split:.0} docs/s, \
             ratio {:.2} over 1 core",
            split.as_secs_f64(),
            rate_split / rate_1
        );
    }
    if !exact {
        bail!("the table of the 2-core run differs from the 1-core run's");
    }
    Ok(())
}

/// Both runs, whether their tables hold the same rows, and the split bound's wall time.
fn measure(args: &ScaleArgs, work: &Path) -> anyhow::Result<(Run, Run, bool, Duration)> {
    let mut runs = Vec::new();
    for cores in [1, 2] {
        let dir = work.join(format!("cores{cores}"));
        std::fs::create_dir_all(&dir)?;
        let pipeline = dir.join("pipeline.yaml");
        std::fs::write(&pipeline, pipeline_yaml(args)?)?;
        if !args.json {
            eprintln!("{} documents on {cores} core(s)…", args.docs);
        }
        let cpus = (0..cores)
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut running = RunningSluice::start_pinned(&pipeline, &dir.join("run.log"), &cpus)?;
        let run = loop {
            if let Some(run) = running.poll()? {
                break run;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        runs.push(run);
    }
    let rows = |cores: u32| -> anyhow::Result<Vec<(String, i64, i64, String)>> {
        let path = work.join(format!("cores{cores}/out/views.db"));
        let db = rusqlite::Connection::open(&path).with_context(|| path.display().to_string())?;
        let mut query =
            db.prepare("SELECT user_id, views, bytes, last_seen FROM pageviews ORDER BY user_id")?;
        let rows = query.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    };
    let one = rows(1)?;
    let exact = !one.is_empty() && one == rows(2)?;
    let two = runs.pop().expect("two runs");
    let one = runs.pop().expect("two runs");
    Ok((one, two, exact, split(args, &work.join("split"))?))
}

/// The split bound: both halves at once on 2 cores; the wall time until both ended.
fn split(args: &ScaleArgs, dir: &Path) -> anyhow::Result<Duration> {
    std::fs::create_dir_all(dir)?;
    if !args.json {
        eprintln!("two processes over pre-split halves on 2 cores…");
    }
    let started = std::time::Instant::now();
    let mut running = Vec::new();
    for half in ["a", "b"] {
        let pipeline = dir.join(format!("pipeline-{half}.yaml"));
        std::fs::write(&pipeline, half_yaml(args, half)?)?;
        let log = dir.join(format!("run-{half}.log"));
        running.push(Some(RunningSluice::start_pinned(&pipeline, &log, "0,1")?));
    }
    while running.iter().any(Option::is_some) {
        for slot in &mut running {
            if let Some(run) = slot
                && run.poll()?.is_some()
            {
                *slot = None;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(started.elapsed())
}
