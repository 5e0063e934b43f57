//! `sluice bench combine`: how close the combiner's whole path comes to bare JSON parsing.
//!
//! ```text
//!  Generator ──chunk of lines──▶ (a) serde_json::from_slice::<Value>, dropped
//!  Generator ──same lines──────▶ (b) combine_right_json (parse ▶ validate ▶ pack key ▶
//!                                    reduce) … ▶ drain
//! ```
//!
//! (b) is by default the combiner's path for JSON text (`--input text`): each line is
//! parsed straight into a compact `Doc`, validated in that form against the collection
//! schema, keyed, and reduced into the key's compact document (a new key keeps it as
//! parsed); the drain yields those compact documents. `--input value` parses each line
//! into a fresh `Value` and hands it to `combine_right` instead, as a caller holding
//! parsed documents does.
//!
//! The generator is deterministic: document `i` belongs to key `(i mod K) · P mod K` (P a
//! prime not dividing K, so every key appears once per K documents, in scattered order)
//! and its other fields come from `splitmix64(i)`. Lines are generated [`CHUNK_LINES`] at
//! a time into one reused buffer, and only the parsing/combining is timed, so N = 10M
//! needs no gigabytes of input. Time is the benchmark thread's CPU time where Linux
//! reports it (`/proc/thread-self/schedstat`) and the run is long enough for its tick
//! granularity, so docs/s means "on one core" even on a busy machine; otherwise, and
//! alongside, the wall clock. Pass (b) is verified: one drained document per key, in
//! strictly increasing key order, whose `views` add up to what was generated; a mismatch
//! fails the command after the figures are printed.

use anyhow::{Context, bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sluice_doc::combine::{BindingSpec, Combiner, CombinerOptions, DEFAULT_MEMORY_BUDGET};
use sluice_doc::compact::Doc;
use sluice_doc::{KeyExtractor, Pointer, Schema};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 64 Ki lines of ~150 bytes: a 10 MiB buffer, large enough that timing each chunk costs
/// nothing measurable.
const CHUNK_LINES: u64 = 64 << 10;

/// The CPU clock is used only when each pass took at least this long: schedstat moves in
/// scheduler ticks of at most 10 ms, so the error stays within a few percent.
const MIN_CPU_TIME: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct CombineArgs {
    /// Documents to generate.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// The combiner's memory budget in bytes.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BUDGET)]
    memory_budget: usize,
    /// Where spilled runs go (default: the system's temporary directory).
    #[arg(long)]
    spill_dir: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// How (b) hands each line to the combiner.
    #[arg(long, value_enum, default_value_t = Input::Text)]
    input: Input,
}

/// The entry point pass (b) measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Input {
    /// `combine_right_json`: the combiner parses the line straight into a compact `Doc`.
    Text,
    /// `serde_json::from_slice` into a fresh `Value`, then `combine_right` (what a caller
    /// holding parsed documents does).
    Value,
}

pub fn run(args: CombineArgs) -> anyhow::Result<()> {
    ensure!(args.keys >= 1, "--keys must be at least 1");
    let progress = progress_bar(2 * args.docs);

    progress.set_message("(a) parse");
    let mut parse_time = Timer::default();
    let mut generated_bytes = 0u64;
    for_each_chunk(&args, |chunk| {
        parse_time.measure(|| {
            for line in chunk.lines() {
                let doc: Value =
                    serde_json::from_slice(line).context("parsing a generated line")?;
                std::hint::black_box(&doc);
            }
            anyhow::Ok(())
        })?;
        generated_bytes += chunk.buf.len() as u64;
        progress.inc(chunk.ends.len() as u64);
        Ok(())
    })?;

    progress.set_message("(b) combine");
    let mut combiner = Combiner::new(
        vec![binding()?],
        CombinerOptions {
            memory_budget: args.memory_budget,
            spill_dir: args.spill_dir.clone(),
            ..Default::default()
        },
    );
    let mut combine_time = Timer::default();
    let mut generated_views = 0u64;
    for_each_chunk(&args, |chunk| {
        combine_time.measure(|| {
            for line in chunk.lines() {
                match args.input {
                    Input::Text => combiner.combine_right_json(0, line)?,
                    Input::Value => {
                        let doc =
                            serde_json::from_slice(line).context("parsing a generated line")?;
                        combiner.combine_right(0, doc)?;
                    }
                }
            }
            anyhow::Ok(())
        })?;
        generated_views += chunk.views;
        progress.inc(chunk.ends.len() as u64);
        Ok(())
    })?;
    let stats = combiner.stats();

    progress.set_message("(b) drain");
    let mut drain_time = Timer::default();
    let drained = drain_time.measure(|| verify_drain(combiner))?;
    progress.finish_and_clear();

    let combine_total = combine_time.add(drain_time);
    // Linux advances a running thread's schedstat at scheduler ticks (1-10 ms), so short
    // runs fall back to the wall clock.
    let cpu_clock = [parse_time, combine_total]
        .iter()
        .all(|t| t.cpu.is_some_and(|cpu| cpu >= MIN_CPU_TIME));
    let seconds = |time: Timer| match (cpu_clock, time.cpu) {
        (true, Some(cpu)) => cpu.as_secs_f64(),
        _ => time.wall.as_secs_f64(),
    };
    let per_sec = |time: Timer| args.docs as f64 / seconds(time);
    let report = json!({
        "docs": args.docs,
        "keys": args.keys,
        "memory_budget": args.memory_budget,
        "input": format!("{:?}", args.input).to_lowercase(),
        "avg_doc_bytes": generated_bytes as f64 / args.docs.max(1) as f64,
        "clock": if cpu_clock { "thread_cpu" } else { "wall" },
        "parse_seconds": seconds(parse_time),
        "combine_seconds": seconds(combine_total),
        "drain_seconds": seconds(drain_time),
        "parse_wall_seconds": parse_time.wall.as_secs_f64(),
        "combine_wall_seconds": combine_total.wall.as_secs_f64(),
        "parse_docs_per_sec": per_sec(parse_time),
        "combine_docs_per_sec": per_sec(combine_total),
        "ratio": seconds(parse_time) / seconds(combine_total),
        "peak_rss_bytes": peak_rss_bytes()?,
        "spilled_runs": stats.spilled_runs,
        "spilled_bytes": stats.spilled_bytes,
        "drained_keys": drained.keys,
        "drained_views": drained.views,
        "generated_views": generated_views,
    });
    print_report(&report, args.json)?;

    let expected_keys = args.docs.min(args.keys);
    if drained.keys != expected_keys || drained.views != generated_views {
        bail!(
            "wrong drained output: {} keys (expected {expected_keys}), views sum {} (expected {generated_views})",
            drained.keys,
            drained.views
        );
    }
    Ok(())
}

/// Time spent in the measured sections: wall clock, and the thread's CPU time if known.
#[derive(Debug, Clone, Copy, Default)]
struct Timer {
    wall: Duration,
    cpu: Option<Duration>,
}

impl Timer {
    fn measure<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (wall, cpu) = (Instant::now(), thread_cpu_time());
        let out = f();
        self.wall += wall.elapsed();
        self.cpu = match (cpu, thread_cpu_time()) {
            (Some(start), Some(end)) => Some(self.cpu.unwrap_or_default() + (end - start)),
            _ => None,
        };
        out
    }

    fn add(self, other: Timer) -> Timer {
        Timer {
            wall: self.wall + other.wall,
            cpu: self.cpu.zip(other.cpu).map(|(a, b)| a + b),
        }
    }
}

/// CPU time of the calling thread so far: the first field of Linux's schedstat, in ns.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:12} {wide_bar} {pos}/{len} {per_sec}") {
        bar.set_style(style);
    }
    bar
}

/// `merge` at the root and in `tags`, `sum` on the counters, `maximize` on the timestamp.
fn binding() -> anyhow::Result<BindingSpec> {
    let schema = json!({
        "type": "object",
        "required": ["user"],
        "reduce": {"strategy": "merge"},
        "properties": {
            "user": {"type": "string"},
            "views": {"type": "integer", "reduce": {"strategy": "sum"}},
            "bytes": {"type": "integer", "reduce": {"strategy": "sum"}},
            "last_seen": {"type": "string", "reduce": {"strategy": "maximize"}},
            "page": {"type": "string"},
            "country": {"type": "string"},
            "tags": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "reduce": {"strategy": "merge"}
            }
        }
    });
    Ok(BindingSpec {
        schema: Arc::new(Schema::compile(&schema)?),
        key: KeyExtractor::new(vec![Pointer::parse("/user")?], vec![None]),
        name: "bench/pageviews".to_string(),
        full: true,
        deletions: true,
    })
}

struct DrainSummary {
    keys: u64,
    views: u64,
}

/// Consumes every drained document, checking key order and adding up `views`.
fn verify_drain(combiner: Combiner) -> anyhow::Result<DrainSummary> {
    let mut summary = DrainSummary { keys: 0, views: 0 };
    let mut previous: Option<Vec<u8>> = None;
    for drained in combiner.drain()? {
        let drained = drained?;
        if previous.as_ref().is_some_and(|p| *p >= drained.key) {
            bail!(
                "drained keys are not strictly increasing at key #{}",
                summary.keys
            );
        }
        summary.keys += 1;
        summary.views += (drained.doc.get("views"))
            .and_then(Doc::as_u64)
            .context("drained doc without views")?;
        previous = Some(drained.key);
    }
    Ok(summary)
}

/// One chunk of generated lines, back to back in `buf`, each ending at `ends[i]`.
#[derive(Default)]
struct Chunk {
    buf: Vec<u8>,
    ends: Vec<usize>,
    /// Sum of `views` over the chunk's documents.
    views: u64,
}

impl Chunk {
    fn lines(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.buf[start..end])
    }
}

/// Calls `f` with every chunk of the deterministic document sequence, reusing one buffer.
fn for_each_chunk(
    args: &CombineArgs,
    mut f: impl FnMut(&Chunk) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let prime = [1_000_003u64, 1_000_033, 1_000_037]
        .into_iter()
        .find(|p| !args.keys.is_multiple_of(*p))
        .context("no scattering prime fits --keys")?;
    let mut chunk = Chunk::default();
    let mut next = 0;
    while next < args.docs {
        let end = args.docs.min(next + CHUNK_LINES);
        chunk.buf.clear();
        chunk.ends.clear();
        chunk.views = 0;
        for i in next..end {
            let key = ((i % args.keys) as u128 * prime as u128 % args.keys as u128) as u64;
            chunk.views += write_doc(&mut chunk.buf, i, key)?;
            chunk.ends.push(chunk.buf.len());
        }
        f(&chunk)?;
        next = end;
    }
    Ok(())
}

const BROWSERS: [&str; 4] = ["firefox", "chrome", "safari", "edge"];
const SYSTEMS: [&str; 3] = ["linux", "macos", "windows"];
const COUNTRIES: [&str; 8] = ["de", "fr", "us", "br", "jp", "in", "ng", "se"];

/// Appends document `i` of key `key` (about 150 bytes) and returns its `views`.
fn write_doc(out: &mut Vec<u8>, i: u64, key: u64) -> anyhow::Result<u64> {
    let r = splitmix64(i);
    let views = 1 + r % 9;
    let (hour, minute, second) = ((r >> 8) % 24, (r >> 16) % 60, (r >> 24) % 60);
    write!(
        out,
        r#"{{"user":"u-{key:08}","views":{views},"bytes":{bytes},"last_seen":"2026-11-29T{hour:02}:{minute:02}:{second:02}Z","page":"/docs/page-{page}","tags":{{"browser":"{browser}","os":"{os}"}},"country":"{country}"}}"#,
        bytes = (r >> 32) % 5000,
        page = (r >> 40) % 1000,
        browser = BROWSERS[(r >> 50) as usize % BROWSERS.len()],
        os = SYSTEMS[(r >> 54) as usize % SYSTEMS.len()],
        country = COUNTRIES[(r >> 58) as usize % COUNTRIES.len()],
    )?;
    Ok(views)
}

fn splitmix64(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The process's peak resident set (`VmHWM`), in bytes.
fn peak_rss_bytes() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .context("no VmHWM in /proc/self/status")?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse()?;
    Ok(kib * 1024)
}

fn print_report(report: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{report}");
        return Ok(());
    }
    let mib = |bytes: &Value| bytes.as_f64().unwrap_or(0.0) / (1 << 20) as f64;
    let number = |name: &str| report[name].as_f64().unwrap_or(0.0);
    println!(
        "{} documents (avg {:.0} bytes), {} keys, memory budget {:.0} MiB",
        report["docs"],
        number("avg_doc_bytes"),
        report["keys"],
        mib(&report["memory_budget"])
    );
    println!(
        "clock:                {:>12}",
        report["clock"].as_str().unwrap_or("")
    );
    println!(
        "(a) parse only:       {:>12.0} docs/s  ({:.2} s)",
        number("parse_docs_per_sec"),
        number("parse_seconds")
    );
    println!(
        "(b) sluice combine:   {:>12.0} docs/s  ({:.2} s, of which drain {:.2} s)",
        number("combine_docs_per_sec"),
        number("combine_seconds"),
        number("drain_seconds")
    );
    println!("ratio (b)/(a):        {:>12.2}", number("ratio"));
    println!(
        "peak RSS:             {:>12.1} MiB",
        mib(&report["peak_rss_bytes"])
    );
    println!(
        "spilled:              {:>12} runs, {:.1} MiB",
        report["spilled_runs"],
        mib(&report["spilled_bytes"])
    );
    println!(
        "drained:              {:>12} keys, views sum {} (generated {})",
        report["drained_keys"], report["drained_views"], report["generated_views"]
    );
    Ok(())
}
