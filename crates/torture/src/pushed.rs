//! The torture of the HTTP source: clients post the model's documents while runs are
//! SIGKILLed under them, and retry every request that got no 200 with its
//! Idempotency-Key until one comes. The clients serve the cluster scenario too
//! (`cluster.rs`): there they post to every member in turn, as a load balancer
//! would, and follow a 503 naming the holder to its address.
//!
//! ```text
//!  segments ─▶ bodies of BODY_DOCS documents, keyed body-N ─▶ CLIENTS threads ─POST─▶ sluice run
//!                                      ▲ no answer, 503, 429, refused: retry the same key │
//!                                      └──────────────────────────────────────────────────┘
//!  faults: SIGKILL after a random delay, restart at once; then a run that lives until every
//!  body is acknowledged, stopped by SIGTERM (it must exit 0)
//! ```
//!
//! Every body ends acknowledged, so the store must hold each exactly once: those a
//! client was told of before a kill (their retries answer the original transaction),
//! and those whose answer a kill swallowed (committed or not, their retries must apply
//! them once). The final comparison with the model says whether it does; an answer
//! counting other documents than its body held is an anomaly.

use super::input::{HTTP_SOURCE, HTTP_TOKEN, Input};
use super::model::Rng;
use super::{Harness, RUN_TIMEOUT};
use anyhow::bail;
use serde_json::Value;
use sluice_http::client::Client;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Documents per body: several bodies per transaction, and transactions cut through
/// bodies' boundaries never (a body is never split).
const BODY_DOCS: usize = 100;
/// Concurrent clients.
const CLIENTS: usize = 4;
/// A client's pause before it retries.
const RETRY: Duration = Duration::from_millis(20);

/// One body, as its client posts it until acknowledged.
struct Body {
    key: String,
    text: Vec<u8>,
    docs: u64,
}

#[derive(Default)]
struct Work {
    queue: VecDeque<Body>,
    /// Bodies taken by a client and not yet acknowledged.
    in_flight: usize,
    acknowledged: u64,
    /// Retries sent to the holder a 503 named (in a cluster).
    redirected: u64,
    /// Answers that contradict their body (anomalies).
    wrong: Vec<String>,
    stop: bool,
}

pub(super) struct Clients {
    work: Arc<Mutex<Work>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    next_key: usize,
}

impl Clients {
    /// Clients posting to `addresses` (one server's, or each cluster member's).
    pub(super) fn start(addresses: &[SocketAddr]) -> Clients {
        let work = Arc::new(Mutex::new(Work::default()));
        let threads = (0..CLIENTS)
            .map(|first| {
                let (work, addresses) = (work.clone(), addresses.to_vec());
                std::thread::spawn(move || client(&addresses, first, &work))
            })
            .collect();
        Clients {
            work,
            threads,
            next_key: 0,
        }
    }

    fn work(&self) -> std::sync::MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `docs` to the clients, in bodies.
    fn post(&mut self, docs: &[Value]) {
        let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        for chunk in docs.chunks(BODY_DOCS) {
            let text = chunk
                .iter()
                .flat_map(|d| format!("{d}\n").into_bytes())
                .collect();
            work.queue.push_back(Body {
                key: format!("body-{}", self.next_key),
                text,
                docs: chunk.len() as u64,
            });
            self.next_key += 1;
        }
    }

    /// Whether every body handed over was acknowledged.
    pub(super) fn all_acknowledged(&self) -> bool {
        let work = self.work();
        work.queue.is_empty() && work.in_flight == 0
    }

    fn stop(self) -> Work {
        self.work().stop = true;
        for thread in self.threads {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.work.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A client: takes the next body, posts it until a 200, again and again; to
/// `addresses` in turn from the `first`, or at once to the holder a 503 names.
fn client(addresses: &[SocketAddr], first: usize, work: &Mutex<Work>) {
    let lock = || work.lock().unwrap_or_else(|e| e.into_inner());
    let mut http: Vec<Client> = (addresses.iter())
        .map(|address| Client::new(*address, HTTP_TOKEN))
        .collect();
    let mut at = first % addresses.len();
    loop {
        let body = {
            let mut work = lock();
            if work.stop {
                return;
            }
            let body = work.queue.pop_front();
            work.in_flight += usize::from(body.is_some());
            body
        };
        let Some(body) = body else {
            std::thread::sleep(RETRY);
            continue;
        };
        loop {
            if lock().stop {
                return;
            }
            match http[at].ingest(HTTP_SOURCE, Some(&body.key), &body.text) {
                Ok(r) if r.status == 200 => {
                    let mut work = lock();
                    if r.json()["documents"].as_u64() != Some(body.docs) {
                        let answer = String::from_utf8_lossy(&r.body).into_owned();
                        let docs = body.docs;
                        work.wrong
                            .push(format!("{}: {docs} documents, answered {answer}", body.key));
                    }
                    work.acknowledged += 1;
                    work.in_flight -= 1;
                    break;
                }
                // The server is down, closing, full or starting, or does not hold the
                // shard: retry the same key, where a 503 sends it or at the next server.
                Ok(r) if matches!(r.status, 429 | 503) => {
                    let holder = (r.header("sluice-holder-address"))
                        .and_then(|named| addresses.iter().position(|a| a.to_string() == named))
                        .filter(|&holder| holder != at);
                    lock().redirected += u64::from(holder.is_some());
                    at = holder.unwrap_or((at + 1) % addresses.len());
                    std::thread::sleep(RETRY);
                }
                Err(_) => {
                    at = (at + 1) % addresses.len();
                    std::thread::sleep(RETRY);
                }
                Ok(r) => {
                    let mut work = lock();
                    let answer = String::from_utf8_lossy(&r.body).into_owned();
                    work.wrong
                        .push(format!("{}: answered {} {answer}", body.key, r.status));
                    work.in_flight -= 1;
                    break;
                }
            }
        }
    }
}

/// SIGKILLs at random moments while clients post, until `faults` have fired; then a
/// run that lives until every body is acknowledged, stopped by SIGTERM.
pub(super) fn random_kills(h: &mut Harness, faults: u64, rng: &mut Rng) -> anyhow::Result<()> {
    let (pipeline, _) = h.pipeline("run", &h.store.endpoint_yaml())?;
    let Input::Http { address, .. } = &h.input else {
        bail!("the http torture needs --source http");
    };
    let mut clients = Clients::start(&[*address]);
    let result = kill_under_clients(h, &mut clients, &pipeline, faults, rng);
    stop(h, clients);
    result
}

/// Stops the clients; each answer that contradicted its body is an anomaly.
pub(super) fn stop(h: &mut Harness, clients: Clients) {
    let work = clients.stop();
    for wrong in work.wrong {
        h.report
            .anomaly_of("wrong answer", format!("a wrong answer: {wrong}"));
    }
    println!(
        "{} bodies acknowledged, {} retries sent to the holder a 503 named",
        work.acknowledged, work.redirected
    );
}

/// Hands the documents appended since the last call to the clients.
pub(super) fn hand_over(h: &mut Harness, clients: &mut Clients) {
    if let Input::Http { unsent, .. } = &mut h.input {
        clients.post(&std::mem::take(unsent));
    }
}

fn kill_under_clients(
    h: &mut Harness,
    clients: &mut Clients,
    pipeline: &std::path::Path,
    faults: u64,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let Input::Http { address, .. } = h.input else {
        bail!("the http torture needs --source http");
    };
    hand_over(h, clients);
    let mut attempts = 0;
    while h.report.faults < faults {
        attempts += 1;
        if attempts > faults * 4 + 10 {
            h.report
                .anomaly(format!("only {} of {faults} faults fired", h.report.faults));
            break;
        }
        if clients.all_acknowledged() {
            h.append(h.segment)?;
            hand_over(h, clients);
        }
        let delay = Duration::from_millis(100 + rng.below(1_500));
        let outcome = h.run(pipeline, None)?.kill_after(delay)?;
        h.report.armed("SIGKILL", outcome.killed);
        h.report.restarts += outcome.reopenings() + u64::from(outcome.killed);
        if !outcome.killed {
            h.report.anomaly(format!(
                "{} (SIGKILL): an HTTP source's run ended by itself ({}):\n    {}",
                outcome.name,
                outcome.status,
                outcome.tail()
            ));
        }
    }
    // The last run: serving (so its signal handler is in place), until every body
    // is acknowledged, then a clean stop.
    let mut run = h.run(pipeline, None)?;
    let started = Instant::now();
    let healthy = || {
        Client::new(address, HTTP_TOKEN)
            .request("GET", "/health", &[], b"")
            .is_ok_and(|r| r.status == 200)
    };
    while !healthy() || !clients.all_acknowledged() {
        if run.child.try_wait()?.is_some() || started.elapsed() > RUN_TIMEOUT {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    super::signal(run.child.id(), "TERM")?;
    let outcome = run.wait(RUN_TIMEOUT)?;
    if !outcome.success() || !clients.all_acknowledged() {
        bail!(
            "the final run ({}) did not see every body acknowledged and stop cleanly: {}",
            outcome.status,
            outcome.tail()
        );
    }
    Ok(())
}
