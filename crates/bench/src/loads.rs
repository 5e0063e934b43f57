//! `sluice bench loads`: a transaction that loads a whole large table, under a small
//! memory budget. The promise it checks: loaded documents are held under the combiners'
//! budget (spilled like any other), so a shard's memory does not grow with the table.
//!
//! ```text
//!  input.jsonl: one document per key (run 1) ─▶ sluice run  (a fresh process: every key new)
//!  append one more per key (run 2)          ─▶ sluice run  (a fresh process: every key loaded)
//!  read the table back ─▶ each row equals the reduction computed here ─▶ exact
//! ```
//!
//! Both runs are the `sluice` binary itself (`sluice run`), so what is measured is what a
//! user runs; its peak resident set is read from `/proc/<pid>/status` (`VmHWM`, the
//! kernel's high-water mark) while it runs. Each run is one transaction (its bounds are
//! set above the input), so the second one loads every key of the table at once.
//! Figures: each run's wall time and peak RSS, `ratio_reload` (run 2 over run 1: what
//! loading every key costs on top of storing it), `loaded_keys_per_sec` (keys over run
//! 2's time), and `exact`. The bench fails if the table is not exact.
//!
//! Documents: `{id, n: 1, run, payload}` reduced by `merge` (`n` summed, `run`
//! maximized, `payload` last-write-wins), the payload a deterministic string of
//! `--payload-bytes`. Keys arrive in a scattered order (a stride coprime to the count),
//! as they do from real sources. The store is PostgreSQL, in a schema of the bench's own,
//! dropped at the end (also when a run fails).

use anyhow::{Context, bail, ensure};
use futures::TryStreamExt;
use serde_json::{Value, json};
use sluice_postgres::sql::quote_ident;
use sluice_source_sdk::config::parse_bytes;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

#[derive(clap::Args)]
pub struct LoadsArgs {
    /// Distinct keys: the table's rows, each loaded by the second run.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Each combiner's budget (`runtime.memory_budget`), e.g. `64MiB`.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    memory_budget: u64,
    /// Bytes of each document's payload string.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// The PostgreSQL server (a schema of a unique name is created, then dropped). Plain
    /// text by default: the figures are the loop's and the server's, not a cipher's.
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the bench's folder (pipeline, input, recovery log, logs of both runs).
    #[arg(long)]
    keep: bool,
}

/// One `sluice run` as measured.
pub(super) struct Run {
    pub(super) elapsed: Duration,
    pub(super) peak_rss_bytes: u64,
    /// User plus system CPU time, as last sampled.
    pub(super) cpu_seconds: f64,
}

pub fn run(args: LoadsArgs) -> anyhow::Result<()> {
    ensure!(args.keys > 0, "--keys must be at least 1");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(&args))
}

async fn bench(args: &LoadsArgs) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let schema = format!("sluice_loads_{}_{nanos:x}", std::process::id());
    let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
        .await
        .context("connecting to the server given by --url")?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&schema)))
        .await?;
    let work = std::env::temp_dir().join(&schema);
    let result = runs(args, &client, &schema, &work).await;
    client
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", quote_ident(&schema)))
        .await?;
    if args.keep {
        eprintln!("kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    let (first, second, input_bytes, verdict) = result?;
    report(args, &first, (&second.0, &second.1), input_bytes, &verdict);
    if let Err(differs) = verdict {
        bail!("the table is not the reduction of the input: {differs}");
    }
    Ok(())
}

type Verdict = Result<(), String>;

/// Where the reload's time went: its transactions' phases, in seconds (Load: every key
/// looked up; Store: the rows written; Commit: the store's commit).
struct Phases {
    load: f64,
    store: f64,
    commit: f64,
}

async fn runs(
    args: &LoadsArgs,
    client: &tokio_postgres::Client,
    schema: &str,
    work: &Path,
) -> anyhow::Result<(Run, (Run, Phases), u64, Verdict)> {
    std::fs::create_dir_all(work)?;
    let input = work.join("input.jsonl");
    let pipeline = work.join("pipeline.yaml");
    std::fs::write(&pipeline, pipeline_yaml(args, schema))?;
    let mut input_bytes = append_input(&input, args, 1)?;
    progress(args, format!("run 1: {} new keys", args.keys));
    let first = sluice_run(&pipeline, &work.join("run1.log"))?;
    input_bytes += append_input(&input, args, 2)?;
    progress(args, format!("run 2: {} keys, every one loaded", args.keys));
    let second_log = work.join("run2.log");
    let second = sluice_run(&pipeline, &second_log)?;
    let log = std::fs::read_to_string(&second_log)?;
    let phases = Phases {
        load: phase_secs(&log, &["load_ms"])?,
        store: phase_secs(&log, &["store_ms"])?,
        commit: phase_secs(&log, &["commit_ms"])?,
    };
    progress(args, "checking the table".to_string());
    let verdict = check(args, client, schema).await?;
    Ok((first, (second, phases), input_bytes, verdict))
}

fn progress(args: &LoadsArgs, line: String) {
    if !args.json {
        eprintln!("{line}");
    }
}

fn pipeline_yaml(args: &LoadsArgs, schema: &str) -> String {
    let docs = args.keys;
    // One transaction per run: bounds above what a run reads.
    let max_bytes = docs * (args.payload_bytes as u64 + 128) * 2;
    format!(
        r#"
collections:
  bench/loads:
    key: [/id]
    schema:
      type: object
      required: [id, n, run, payload]
      reduce: {{strategy: merge}}
      properties:
        id: {{type: integer}}
        n: {{type: integer, reduce: {{strategy: sum}}}}
        run: {{type: integer, reduce: {{strategy: maximize}}}}
        payload: {{type: string}}
sources:
  input:
    target: bench/loads
    file: {{path: input.jsonl, format: json}}
materializations:
  loads:
    endpoint: {{postgres: {{url: {url}, schema: {schema}}}}}
    bindings:
      - source: bench/loads
        resource: {{table: loads}}
runtime:
  memory_budget: {budget}
  transactions: {{max_docs: {max_docs}, max_bytes: {max_bytes}, max_duration: 1h}}
"#,
        url = json!(args.url),
        schema = json!(schema),
        budget = args.memory_budget,
        max_docs = docs * 2,
    )
}

/// The key of the `i`-th document of a run: a stride through the keys, coprime to their
/// count, so every key comes once, scattered.
fn key_at(keys: u64, i: u64) -> u64 {
    let mut stride = (7_919 % keys.max(2)) | 1;
    while gcd(stride, keys) != 1 {
        stride += 2;
    }
    ((i as u128 * stride as u128) % keys as u128) as u64
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The payload of `key` written by `run`: a deterministic letter string.
fn payload(key: u64, run: u64, len: usize) -> String {
    let mut state =
        key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ run.wrapping_mul(0xd1b5_4a32_d192_ed03);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (b'a' + (state % 26) as u8) as char
        })
        .collect()
}

/// Appends run `run`'s documents (one per key) to the input; returns the bytes written.
fn append_input(path: &Path, args: &LoadsArgs, run: u64) -> anyhow::Result<u64> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut written = 0;
    let mut line = Vec::new();
    for i in 0..args.keys {
        let id = key_at(args.keys, i);
        line.clear();
        serde_json::to_writer(
            &mut line,
            &json!({"id": id, "n": 1, "run": run, "payload": payload(id, run, args.payload_bytes)}),
        )?;
        line.push(b'\n');
        out.write_all(&line)?;
        written += line.len() as u64;
    }
    out.flush()?;
    Ok(written)
}

/// Runs `sluice run <pipeline>` (this binary) to its end, its output to `log`, sampling
/// its peak resident set and CPU time until it exits.
pub(super) fn sluice_run(pipeline: &Path, log: &Path) -> anyhow::Result<Run> {
    let mut running = RunningSluice::start(pipeline, log)?;
    loop {
        if let Some(run) = running.poll()? {
            return Ok(run);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `sluice run` child (this binary), sampled from `/proc` at each [`poll`]: several
/// can run at once.
///
/// [`poll`]: RunningSluice::poll
pub(super) struct RunningSluice {
    child: std::process::Child,
    log: PathBuf,
    start: Instant,
    peak_rss_bytes: u64,
    cpu_seconds: f64,
}

impl RunningSluice {
    pub(super) fn start(pipeline: &Path, log: &Path) -> anyhow::Result<RunningSluice> {
        let command = Command::new(sluice_app::sibling::sibling("sluice")?);
        Self::spawn(command, pipeline, log)
    }

    /// [`RunningSluice::start`] on the cores `cpus` only (`taskset -c`, e.g. `0,1`).
    pub(super) fn start_pinned(
        pipeline: &Path,
        log: &Path,
        cpus: &str,
    ) -> anyhow::Result<RunningSluice> {
        let mut command = Command::new("taskset");
        command
            .args(["-c", cpus])
            .arg(sluice_app::sibling::sibling("sluice")?);
        Self::spawn(command, pipeline, log)
    }

    fn spawn(mut command: Command, pipeline: &Path, log: &Path) -> anyhow::Result<RunningSluice> {
        let log_file = std::fs::File::create(log)?;
        let start = Instant::now();
        let child = command
            .arg("run")
            .arg(pipeline)
            // Each transaction's phases (`transaction committed`: load_ms, store_ms,
            // commit_ms) go to the log, for the benches that split the time by phase.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG")
                    .unwrap_or_else(|_| "warn,sluice_runtime::txn=debug".into()),
            )
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .stdin(Stdio::null())
            .spawn()
            .context("starting sluice run")?;
        Ok(RunningSluice {
            child,
            log: log.to_path_buf(),
            start,
            peak_rss_bytes: 0,
            cpu_seconds: 0.0,
        })
    }

    /// Samples the process; once it has exited, what it measured (an error, with its
    /// log, if it failed).
    pub(super) fn poll(&mut self) -> anyhow::Result<Option<Run>> {
        let pid = self.child.id();
        if let Some(rss) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| vm_hwm(&status))
        {
            self.peak_rss_bytes = self.peak_rss_bytes.max(rss);
        }
        if let Some(cpu) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| cpu_seconds(&stat))
        {
            self.cpu_seconds = self.cpu_seconds.max(cpu);
        }
        let Some(status) = self.child.try_wait()? else {
            return Ok(None);
        };
        if !status.success() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("sluice run failed ({status}):\n{text}");
        }
        Ok(Some(Run {
            elapsed: self.start.elapsed(),
            peak_rss_bytes: self.peak_rss_bytes,
            cpu_seconds: self.cpu_seconds,
        }))
    }
}

/// The Store and Commit phases of every transaction of a run's log, in seconds.
pub(super) fn sink_secs(log: &str) -> anyhow::Result<f64> {
    phase_secs(log, &["store_ms", "commit_ms"])
}

/// The phases `phases` (`load_ms`, `store_ms`, `commit_ms`) of every transaction of a
/// run's log (`transaction committed` lines, see [`RunningSluice::start`]), summed, in
/// seconds.
pub(super) fn phase_secs(log: &str, phases: &[&str]) -> anyhow::Result<f64> {
    // The log may be colored: drop the escape sequences (ESC [ … m).
    let mut plain = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    let log = plain.as_str();
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!("{name}="))? + name.len() + 1;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let ms: u64 = log
        .lines()
        .filter(|l| l.contains("transaction committed"))
        .flat_map(|l| phases.iter().map(move |phase| field(l, phase).unwrap_or(0)))
        .sum();
    ensure!(
        log.contains("transaction committed"),
        "the run logged no transaction's phases"
    );
    Ok(ms as f64 / 1000.0)
}

/// User plus system CPU seconds of a `/proc/<pid>/stat`: fields 14 and 15 (utime,
/// stime) counted after the command's closing parenthesis, at Linux's fixed 100 ticks
/// a second.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// `VmHWM` of a `/proc/<pid>/status`, in bytes.
fn vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether every key's row is the reduction of its two documents: `n` 2, `run` 2, run
/// 2's payload; and no other row.
async fn check(
    args: &LoadsArgs,
    client: &tokio_postgres::Client,
    schema: &str,
) -> anyhow::Result<Verdict> {
    let table = format!("{}.{}", quote_ident(schema), quote_ident("loads"));
    let query = format!("SELECT id, flow_document::text FROM {table}");
    let rows = client
        .query_raw(&query, std::iter::empty::<i64>())
        .await
        .with_context(|| query.clone())?;
    futures::pin_mut!(rows);
    let mut seen = vec![false; args.keys as usize];
    let mut mismatched = 0u64;
    let mut first_mismatch = None;
    while let Some(row) = rows.try_next().await? {
        let id: i64 = row.try_get(0)?;
        let doc: Value = serde_json::from_str(row.try_get::<_, &str>(1)?)?;
        let Some(slot) = usize::try_from(id).ok().and_then(|i| seen.get_mut(i)) else {
            return Ok(Err(format!("row {id} is not a key of the input")));
        };
        if std::mem::replace(slot, true) {
            return Ok(Err(format!("key {id} has two rows")));
        }
        let id = id as u64;
        let expected =
            json!({"id": id, "n": 2, "run": 2, "payload": payload(id, 2, args.payload_bytes)});
        if doc != expected {
            mismatched += 1;
            first_mismatch.get_or_insert_with(|| format!("key {id}: {doc}, wanted {expected}"));
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    Ok(match (missing, first_mismatch) {
        (0, None) => Ok(()),
        (missing, mismatch) => Err(format!(
            "{missing} keys missing, {mismatched} rows differ{}",
            mismatch
                .map(|m| format!(" (first: {m})"))
                .unwrap_or_default()
        )),
    })
}

fn report(
    args: &LoadsArgs,
    first: &Run,
    (second, phases): (&Run, &Phases),
    input_bytes: u64,
    verdict: &Verdict,
) {
    let secs = |r: &Run| r.elapsed.as_secs_f64();
    let ratio_reload = secs(second) / secs(first).max(1e-9);
    let loaded_keys_per_sec = args.keys as f64 / secs(second).max(1e-9);
    let peak_rss_bytes = first.peak_rss_bytes.max(second.peak_rss_bytes);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        let figures = json!({
            "keys": args.keys,
            "memory_budget": args.memory_budget,
            "payload_bytes": args.payload_bytes,
            "input_bytes": input_bytes,
            "cores": cores,
            "first_secs": secs(first),
            "second_secs": secs(second),
            "second_load_secs": phases.load,
            "second_store_secs": phases.store,
            "second_commit_secs": phases.commit,
            "ratio_reload": ratio_reload,
            "loaded_keys_per_sec": loaded_keys_per_sec,
            "first_peak_rss_bytes": first.peak_rss_bytes,
            "second_peak_rss_bytes": second.peak_rss_bytes,
            "peak_rss_bytes": peak_rss_bytes,
            "exact": verdict.is_ok(),
        });
        println!("{figures}");
        return;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{} keys, memory budget {:.0} MiB, {:.0} MiB of input, {cores} cores",
        args.keys,
        mib(args.memory_budget),
        mib(input_bytes)
    );
    println!(
        "  run 1 (every key new):    {:>7.2} s, peak RSS {:>6.0} MiB",
        secs(first),
        mib(first.peak_rss_bytes)
    );
    println!(
        "  run 2 (every key loaded): {:>7.2} s, peak RSS {:>6.0} MiB, {:.0} loaded keys/s",
        secs(second),
        mib(second.peak_rss_bytes),
        loaded_keys_per_sec
    );
    println!(
        "    its phases: load {:.2} s, store {:.2} s, commit {:.2} s",
        phases.load, phases.store, phases.commit
    );
    println!("  ratio_reload (run 2 / run 1): {ratio_reload:.2}");
    match verdict {
        Ok(()) => println!("  exact: the table equals the reduction of the input"),
        Err(differs) => println!("  NOT exact: {differs}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_comes_once_per_run() {
        for keys in [1, 2, 3, 10, 7_919, 7_920, 100_003] {
            let mut seen = vec![false; keys as usize];
            for i in 0..keys {
                let k = key_at(keys, i) as usize;
                assert!(!seen[k], "key {k} twice of {keys}");
                seen[k] = true;
            }
        }
    }

    #[test]
    fn cpu_time_is_utime_plus_stime_in_ticks() {
        let stat = "42 (sluice run) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9";
        assert_eq!(cpu_seconds(stat), Some(3.0));
    }

    #[test]
    fn vm_hwm_reads_kib() {
        let status = "Name:\tsluice\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t1 kB\n";
        assert_eq!(vm_hwm(status), Some(2 << 20));
        assert_eq!(vm_hwm("Name: zombie\n"), None);
    }
}
