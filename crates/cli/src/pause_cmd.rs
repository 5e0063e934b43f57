//! `sluice pause` and `sluice resume`: the whole pipeline, or one source, held or
//! released at run time, through the status API of the process running it
//! (`POST /api/pause|resume[?source=NAME]`), addressed as `sluice status` addresses it
//! (`--metrics`, else the file's `runtime.metrics`, its token, and `--ca` over TLS).
//! Prints the resulting state of the pipeline and of each source.

use crate::pipeline_cmd::load;
use crate::status_cmd::ask;
use anyhow::Context;
use clap::Args;
use sluice_app::registry;
use sluice_runtime::pause::Answer;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub struct PauseArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Only this source (a name of the file's `sources:`); every source by default.
    pub source: Option<String>,
    /// Where the running process serves its status (`sluice run --metrics ADDR`);
    /// the pipeline file's `runtime.metrics` by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// The CA that signed the status server's certificate (PEM), when
    /// `runtime.metrics.tls` serves HTTPS.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// `verb`: `pause` or `resume`.
pub fn main(verb: &str, args: PauseArgs) -> anyhow::Result<()> {
    let pipeline = load(&args.pipeline, &registry())?;
    let Some(server) = pipeline.runtime.metrics_server(args.metrics) else {
        anyhow::bail!(
            "no status address to reach the running process: set runtime.metrics in {} or \
             give --metrics ADDR (as `sluice run --metrics ADDR` serves it)",
            args.pipeline.display()
        );
    };
    let path = match &args.source {
        Some(source) => format!("/api/{verb}?source={}", query_escaped(source)),
        None => format!("/api/{verb}"),
    };
    let response = ask(&server, args.ca.as_deref(), "POST", &path)
        .with_context(|| format!("asking the process serving on {} to {verb}", server.listen))?;
    let body = String::from_utf8_lossy(&response.body);
    anyhow::ensure!(
        response.status == 200,
        "HTTP status {}: {body}",
        response.status
    );
    let answer: Answer = serde_json::from_slice(&response.body)
        .with_context(|| format!("reading the answer: {body}"))?;
    println!("pipeline {}", answer.state);
    for (name, state) in &answer.sources {
        println!("  source {name}: {state}");
    }
    Ok(())
}

/// `value` with what a query value cannot hold as is escaped as `%XX`.
fn query_escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}
