//! `sluice bench iceberg`: Sluice into an Apache Iceberg table against its two
//! baselines, in the same run:
//!
//! ```text
//!  datagen pageviews ─▶ pageviews.jsonl ─▶ sluice run ─▶ Iceberg table (change log)
//!                                            │  its rows, read back as Arrow batches
//!                                            └─▶ parquet's ArrowWriter, straight to a file,
//!                                                the sink's Snappy compression (the limit)
//!  pageviews.jsonl ─▶ pyiceberg script: parse, reduce per key in Python, build a pyarrow
//!                     table, append                               (what a user would write)
//! ```
//!
//! Sluice is timed from its start to its exit: reading and parsing the input, reducing
//! it per key and transaction, building Arrow batches, writing Parquet, committing the
//! snapshot. pyiceberg does the same work from the same input, timed from its first line
//! read to its committed append: `ratio_pyiceberg` is its time over Sluice's. ArrowWriter
//! writes the rows Sluice wrote, timed from its first batch to its closed file: the
//! limit of the sink alone. `sink_rows_per_sec` and `ratio_parquet_sink` time only the
//! sink's part of each transaction (its Store and Commit phases, from the run's
//! `transaction committed` lines: the reduced documents as Store messages, Arrow batches,
//! Parquet, fsync); `ratio_parquet` is Sluice's whole run over ArrowWriter. `exact`:
//! both tables' rows add up to the input's views.
//!
//! `--mode upsert` benches the other kind of table, the view: one row per key, updated
//! in place ([`upsert`]).

mod upsert;

use super::loads::{sink_secs, sluice_run};
use anyhow::{Context, bail, ensure};
use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::json;
use sluice_datagen::pageview;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The generator's seed.
pub(super) const SEED: u64 = 7;
/// The pyiceberg baseline's script.
const APPEND_PY: &str = include_str!("iceberg_append.py");

#[derive(clap::Args)]
pub struct IcebergArgs {
    /// changelog: a change log table (`mode: changelog`) against ArrowWriter and
    /// pyiceberg's append. upsert: the view (`mode: upsert`), the input reduced into it
    /// twice (a second run of as many documents over the same keys), against pyiceberg's
    /// `Table.upsert`.
    #[arg(long, value_enum, default_value = "changelog")]
    pub mode: TableMode,
    /// Documents in the input (with --mode upsert: in each of its two runs).
    #[arg(long, default_value_t = 1_000_000)]
    pub docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    pub keys: u64,
    /// With --mode upsert: run Sluice only, not pyiceberg's baseline (its ratio is then
    /// null); what the memory-bound test runs.
    #[arg(long)]
    pub no_pyiceberg: bool,
    /// With --mode upsert: the runs' `runtime.memory_budget`.
    #[arg(long, default_value = "64MiB")]
    pub memory_budget: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Keep the bench's folder (input, pipeline, catalog, warehouse, logs).
    #[arg(long)]
    pub keep: bool,
}

/// The sink's two kinds of table.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableMode {
    Changelog,
    Upsert,
}

/// One contestant's figures.
struct Figure {
    rows: u64,
    secs: f64,
    bytes: u64,
}

impl Figure {
    fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.secs
    }

    fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs
    }
}

pub fn run(args: IcebergArgs) -> anyhow::Result<()> {
    ensure!(args.keys > 0, "--keys must be at least 1");
    ensure!(
        args.mode == TableMode::Upsert || (!args.no_pyiceberg && args.memory_budget == "64MiB"),
        "--no-pyiceberg and --memory-budget are options of --mode upsert"
    );
    let (sluice, sink, parquet, pyiceberg, exact) = match args.mode {
        TableMode::Upsert => return upsert::run(&args),
        TableMode::Changelog => in_folder(&args, measure)?,
    };
    let ratio_parquet = sluice.rows_per_sec() / parquet.rows_per_sec();
    let ratio_parquet_sink = sink.rows_per_sec() / parquet.rows_per_sec();
    let ratio_pyiceberg = pyiceberg.secs / sluice.secs;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        println!(
            "{}",
            json!({
                "docs": args.docs,
                "keys": args.keys,
                "rows": sluice.rows,
                "cores": cores,
                "sluice_secs": sluice.secs,
                "sluice_rows_per_sec": sluice.rows_per_sec(),
                "sluice_docs_per_sec": args.docs as f64 / sluice.secs,
                "sluice_mb_per_sec": sluice.mb_per_sec(),
                "sink_rows_per_sec": sink.rows_per_sec(),
                "sink_mb_per_sec": sink.mb_per_sec(),
                "parquet_rows_per_sec": parquet.rows_per_sec(),
                "parquet_mb_per_sec": parquet.mb_per_sec(),
                "pyiceberg_rows_per_sec": pyiceberg.rows_per_sec(),
                "pyiceberg_docs_per_sec": args.docs as f64 / pyiceberg.secs,
                "pyiceberg_secs": pyiceberg.secs,
                "pyiceberg_mb_per_sec": pyiceberg.mb_per_sec(),
                "ratio_parquet": ratio_parquet,
                "ratio_parquet_sink": ratio_parquet_sink,
                "ratio_pyiceberg": ratio_pyiceberg,
                "exact": exact,
            })
        );
    } else {
        println!(
            "{} documents over {} keys → {} rows, {cores} cores",
            args.docs, args.keys, sluice.rows
        );
        for (name, f) in [
            ("sluice (end to end)", &sluice),
            ("sluice's sink phases", &sink),
            ("parquet ArrowWriter", &parquet),
            ("pyiceberg reduce+append", &pyiceberg),
        ] {
            println!(
                "  {name:<22} {:>10.0} rows/s {:>8.1} MB/s  ({:.2} s)",
                f.rows_per_sec(),
                f.mb_per_sec(),
                f.secs
            );
        }
        println!(
            "  ratio_parquet {ratio_parquet:.2} (target ≥ 0.7; sink phases alone \
             {ratio_parquet_sink:.2}), ratio_pyiceberg {ratio_pyiceberg:.2} (target ≥ 3), \
             exact: {exact}"
        );
    }
    ensure!(exact, "the table does not add up to the input");
    Ok(())
}

/// `measure` run in a new folder of the bench's, removed after unless `--keep`.
pub(super) fn in_folder<T>(
    args: &IcebergArgs,
    measure: impl FnOnce(&IcebergArgs, &Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let dir = std::env::temp_dir().join(format!(
        "sluice-bench-iceberg-{}-{}",
        std::process::id(),
        clock.subsec_nanos()
    ));
    std::fs::create_dir_all(&dir)?;
    let result = measure(args, &dir);
    if args.keep {
        eprintln!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

pub(super) fn progress(args: &IcebergArgs, line: impl AsRef<str>) {
    if !args.json {
        eprintln!("{}", line.as_ref());
    }
}

/// Sluice end to end, its sink's phases, ArrowWriter, pyiceberg; and whether exact.
type Figures = (Figure, Figure, Figure, Figure, bool);

fn measure(args: &IcebergArgs, dir: &Path) -> anyhow::Result<Figures> {
    progress(args, format!("writing {} documents", args.docs));
    let input = dir.join("pageviews.jsonl");
    let views = write_pageviews(&input, args.docs, args.keys)?;

    let pipeline = dir.join("pipeline.yaml");
    std::fs::write(
        &pipeline,
        format!(
            "{}sources:
  file:
    target: bench/pageviews
    file: {{path: {}, format: json}}
materializations:
  lake:
    endpoint:
      iceberg: {{catalog: catalog.db, warehouse: warehouse}}
    bindings:
      - source: bench/pageviews
        resource: {{table: pageviews}}
        delta_updates: true
",
            super::sql::PAGEVIEWS_COLLECTION,
            json!(input.to_string_lossy())
        ),
    )?;
    progress(args, "sluice run into Iceberg");
    let run = sluice_run(&pipeline, &dir.join("run.log"))?;
    let data = data_files(&dir.join("warehouse"))?;
    let batches = read_batches(&data)?;
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let exact = sum_views(&batches)? == views;
    let bytes: u64 = data
        .iter()
        .map(|p| p.metadata().map_or(0, |m| m.len()))
        .sum();
    let sluice = Figure {
        rows,
        secs: run.elapsed.as_secs_f64(),
        bytes,
    };
    let sink = Figure {
        rows,
        secs: sink_secs(&std::fs::read_to_string(dir.join("run.log"))?)?,
        bytes,
    };

    progress(args, "parquet ArrowWriter, the same batches");
    let parquet = arrow_writer(&batches, &dir.join("baseline.parquet"))?;

    progress(
        args,
        "pyiceberg: the same documents, reduced in Python, appended",
    );
    let (pyiceberg, py_exact) = pyiceberg_append(dir, &input, args.docs, views)?;
    Ok((sluice, sink, parquet, pyiceberg, exact && py_exact))
}

/// Writes `docs` pageviews over `keys` keys (the generator's [`SEED`]) to `path` as
/// JSON lines; returns their total views.
pub(super) fn write_pageviews(path: &Path, docs: u64, keys: u64) -> anyhow::Result<i64> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    append_pageviews(path, 0..docs, keys)
}

/// Appends pageviews `seqs` over `keys` keys to `path` (created if missing); returns
/// their total views.
pub(super) fn append_pageviews(
    path: &Path,
    seqs: std::ops::Range<u64>,
    keys: u64,
) -> anyhow::Result<i64> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut file = std::io::BufWriter::new(file);
    let mut views = 0i64;
    let mut text = Vec::with_capacity(160);
    for seq in seqs {
        let doc = pageview(SEED, keys, seq);
        views += doc.views as i64;
        text.clear();
        doc.write_json(&mut text);
        text.push(b'\n');
        file.write_all(&text)?;
    }
    file.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(views)
}

/// The Parquet data files of the warehouse (the table's; staging is empty after a run).
fn data_files(warehouse: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![warehouse.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn read_batches(files: &[PathBuf]) -> anyhow::Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for path in files {
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?
            .with_batch_size(16 * 1024)
            .build()?;
        for batch in reader {
            batches.push(batch?);
        }
    }
    Ok(batches)
}

fn sum_views(batches: &[RecordBatch]) -> anyhow::Result<i64> {
    let mut sum = 0;
    for batch in batches {
        let column = batch.column_by_name("views").context("no views column")?;
        let views = column
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .context("views is not Int64")?;
        sum += views.iter().flatten().sum::<i64>();
    }
    Ok(sum)
}

/// The limit: the batches written straight to one Parquet file, compressed as the sink
/// compresses its data files (Snappy).
fn arrow_writer(batches: &[RecordBatch], path: &Path) -> anyhow::Result<Figure> {
    let Some(first) = batches.first() else {
        bail!("the table holds no rows");
    };
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let started = Instant::now();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path)?, first.schema(), Some(props))?;
    for batch in batches {
        writer.write(batch)?;
    }
    let file = writer.into_inner()?;
    file.sync_all()?;
    let secs = started.elapsed().as_secs_f64();
    Ok(Figure {
        rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
        secs,
        bytes: std::fs::metadata(path)?.len(),
    })
}

/// What a user would otherwise write: pyiceberg reading the input documents, reducing
/// them per key in Python, and appending the rows to a table of its own in a catalog
/// of its own. Its figure, and whether its rows add up to the input's `views`.
fn pyiceberg_append(
    dir: &Path,
    input: &Path,
    docs: u64,
    views: i64,
) -> anyhow::Result<(Figure, bool)> {
    let script = dir.join("append.py");
    std::fs::write(&script, APPEND_PY)?;
    let out = Command::new("python3")
        .arg(&script)
        .arg(input)
        .arg(dir.join("py-catalog.db"))
        .arg(dir.join("py-warehouse"))
        .output()
        .context("running python3")?;
    ensure!(
        out.status.success(),
        "the pyiceberg baseline failed (is pyiceberg[sql-sqlite,pyarrow] installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("pyiceberg printed {}", String::from_utf8_lossy(&out.stdout)))?;
    ensure!(
        figures["docs"].as_u64() == Some(docs),
        "pyiceberg read {} documents, not {docs}",
        figures["docs"]
    );
    let figure = Figure {
        rows: figures["rows"].as_u64().context("rows")?,
        secs: figures["secs"].as_f64().context("secs")?,
        bytes: data_files(&dir.join("py-warehouse"))?
            .iter()
            .map(|p| p.metadata().map_or(0, |m| m.len()))
            .sum(),
    };
    Ok((figure, figures["views"].as_i64() == Some(views)))
}
