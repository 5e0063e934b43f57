//! The HTTP source as the runtime drives it: positioned by recovery, then serving.
//!
//! ```text
//!  open (binds nothing) ─▶ seek {"seq": S}? ─▶ committed(T, {"seq": S}) at start ─▶ replay*
//!     ─▶ first queue/ready: keys file recovered and rewritten, writer thread, bind ─▶ Serving
//!  Serving: queue = whole bodies · committed(txn, {"seq"}) = answers · disconnect = 503s
//! ```
//!
//! A step is whole bodies in sequence order; its resume is
//! `Replay {position: {"seq": last}, data: the framed bodies, hash}`: the data is
//! journaled in the step's intent, as nothing else holds a pushed body. `seek`
//! restores the sequence number; `replay` reads the bodies back from the data. At start
//! (before anything is bound), the replayed bodies are the interrupted transaction's:
//! their keys are pending again, and new bodies are numbered after them. Serving
//! begins at the first `queue` or `ready`, which the reader calls only after every
//! replay, so recovery knows all it needs before a client is heard.
//!
//! In a cluster's shard ([`KeyPlace::Positions`]) there is no keys file: each position
//! also carries the window's keys (`{"seq": S, "keys": {...}}`, see `keys`), `seek` and
//! the commit at start hand them back, and serving starts from them alone.
//!
//! `end_of_input` is never set: the source serves until the run ends (a signal, or
//! `sluice run` stopping for another reason).

use crate::body::{hash, unframe};
use crate::config::HttpConfig;
use crate::ingest::{Pending, Shared, push_records};
use crate::keys::{self, CarriedKeys, KeyPlace, Replayed, StartCommit, Writer, now_ms};
use crate::server::Server;
use serde::Deserialize;
use serde_json::Value;
use sluice_source_sdk::{
    FaultTolerance, Intake, QueueLimits, Queued, Records, Resume, Source, SourceError, Step,
    check_replay,
};
use std::path::PathBuf;
use std::sync::Arc;

pub struct HttpSource {
    name: String,
    config: HttpConfig,
    state_dir: PathBuf,
    /// The check of a body's documents against the collection this source feeds, from
    /// the runtime ([`HttpSource::with_intake`]); `None` outside a pipeline.
    intake: Option<Intake>,
    /// Where the keys are kept: the keys file, or (a cluster's shard) the positions.
    place: KeyPlace,
    phase: Phase,
    /// The runtime's last word: Pause (true) or Extend.
    paused: bool,
}

enum Phase {
    /// Recovery is placing the source; nothing bound yet.
    Positioning {
        /// The recovered checkpoint's commit (`committed` at start).
        start: Option<StartCommit>,
        /// The last sequence number recovered (sought, or replayed).
        last: u64,
        /// Keyed bodies of the interrupted transaction, replayed.
        replayed: Vec<Replayed>,
        /// The keys the recovered position carried (none outside a cluster).
        carried: CarriedKeys,
    },
    Serving {
        shared: Arc<Shared>,
        server: Server,
    },
    Stopped,
}

/// A resume position of this source.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct At {
    seq: u64,
    /// The window's keys, when they travel in the positions.
    #[serde(default)]
    keys: CarriedKeys,
}

impl HttpSource {
    pub fn new(name: &str, config: &HttpConfig, state_dir: PathBuf) -> HttpSource {
        HttpSource {
            name: name.to_string(),
            config: config.clone(),
            state_dir,
            intake: None,
            place: KeyPlace::File,
            phase: Phase::Positioning {
                start: None,
                last: 0,
                replayed: Vec::new(),
                carried: CarriedKeys::new(),
            },
            paused: false,
        }
    }

    /// Checks every body's documents with `intake` before accepting it: a document the
    /// collection would not take refuses the body (400), or is counted as dead-lettered
    /// when the runtime dead-letters such documents (`on_error: skip`).
    pub fn with_intake(mut self, intake: Option<Intake>) -> HttpSource {
        self.intake = intake;
        self
    }

    /// Keeps the idempotency keys in the resume positions rather than in a keys file in
    /// the state folder: for a shard that moves between machines with its recovery log
    /// (`Opening::shard_moves`).
    pub fn keeping_keys_in_positions(mut self) -> HttpSource {
        self.place = KeyPlace::Positions;
        self
    }

    /// Where the server listens, once serving (port 0 in the configuration is
    /// resolved here).
    pub fn address(&self) -> Option<std::net::SocketAddr> {
        match &self.phase {
            Phase::Serving { server, .. } => Some(server.address),
            _ => None,
        }
    }

    fn bad_resume(&self, action: &'static str, resume: &Value, reason: String) -> SourceError {
        SourceError::BadResume {
            name: self.name.clone(),
            action,
            resume: resume.clone(),
            reason,
        }
    }

    fn at(&self, action: &'static str, position: &Value) -> Result<At, SourceError> {
        serde_json::from_value::<At>(position.clone())
            .map_err(|e| self.bad_resume(action, position, e.to_string()))
    }

    /// Starts serving, once: recovers the keys (from the keys file, with its writer
    /// started, or from the position alone), binds.
    async fn serve(&mut self) -> Result<&Arc<Shared>, SourceError> {
        if let Phase::Positioning {
            start,
            last,
            replayed,
            carried,
        } = &mut self.phase
        {
            let (start, last, replayed) = (*start, *last, replayed.clone());
            let carried = std::mem::take(carried);
            let window = self.config.idempotency_window;
            let (table, file) = match self.place {
                KeyPlace::Positions => {
                    let table =
                        keys::recover(Vec::new(), &carried, start, &replayed, now_ms(), window);
                    (table, None)
                }
                KeyPlace::File => {
                    let dir = self.state_dir.clone();
                    let replayed = replayed.clone();
                    let recovered = tokio::task::spawn_blocking(move || {
                        keys::open(&dir, &carried, start, &replayed, now_ms(), window)
                    })
                    .await
                    .map_err(|e| SourceError::Config {
                        name: self.name.clone(),
                        reason: format!("reading the idempotency keys file: {e}"),
                    })?;
                    let (table, file) = recovered.map_err(|e| match e {
                        keys::ReadError::Io { path, error } => SourceError::Io {
                            name: self.name.clone(),
                            path: path.display().to_string(),
                            error,
                        },
                        corrupt @ keys::ReadError::Corrupt { .. } => SourceError::Config {
                            name: self.name.clone(),
                            reason: corrupt.to_string(),
                        },
                    })?;
                    (table, Some(file))
                }
            };
            let pending = replayed
                .into_iter()
                .map(|r| Pending {
                    seq: r.seq,
                    key: r.key,
                    docs: r.docs,
                    dead_lettered: r.dead_lettered,
                })
                .collect();
            let shared = Shared::new(
                &self.name,
                &self.config,
                self.intake.clone(),
                self.place,
                last,
                pending,
                table.clone(),
                self.paused,
            );
            if let Some(file) = file {
                shared.set_writer(Writer::spawn(
                    self.state_dir.join(keys::FILE),
                    file,
                    table,
                    Shared::on_durable(Arc::downgrade(&shared)),
                ));
            }
            let server = match Server::start(shared.clone()).await {
                Ok(server) => server,
                Err(e) => {
                    if let Some(writer) = shared.close("the source could not listen") {
                        let _ = tokio::task::spawn_blocking(|| writer.join()).await;
                    }
                    return Err(e);
                }
            };
            tracing::info!(source = self.name, address = %server.address, "serving HTTP");
            self.phase = Phase::Serving { shared, server };
        }
        match &self.phase {
            Phase::Serving { shared, .. } => Ok(shared),
            Phase::Stopped => Err(SourceError::Config {
                name: self.name.clone(),
                reason: "the source was disconnected".to_string(),
            }),
            Phase::Positioning { .. } => unreachable!("started above"),
        }
    }
}

#[async_trait::async_trait]
impl Source for HttpSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    /// The address can be listened on (and is let go at once).
    async fn probe(&mut self) -> Result<(), SourceError> {
        crate::server::bind(&self.name, self.config.address())
            .await
            .map(drop)
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let at = self.at("seek to", position)?;
        match &mut self.phase {
            Phase::Positioning { last, carried, .. } => {
                *last = at.seq;
                *carried = at.keys;
                Ok(())
            }
            _ => Err(self.bad_resume(
                "seek to",
                position,
                "the source is already serving".to_string(),
            )),
        }
    }

    /// Bodies answered 200 after the adopted position lived only in the intents of
    /// transactions the store no longer holds: their clients were told they were
    /// applied and will not send them again, so going back past them loses them.
    async fn rewound(&mut self, released: &Value) -> Result<(), SourceError> {
        let released = self.at("rewind from", released)?.seq;
        let Phase::Positioning { last, .. } = &self.phase else {
            return Ok(());
        };
        let sought = *last;
        if released <= sought {
            return Ok(());
        }
        Err(SourceError::Unavailable {
            name: self.name.clone(),
            position: serde_json::json!({ "seq": sought }),
            reason: format!(
                "the bodies numbered {} to {released} were answered 200 after it and \
                 cannot be asked for again (their clients were told they were applied): \
                 restore a backup of the store that holds them",
                sought + 1
            ),
        })
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let Resume::Replay {
            position,
            data: Some(data),
            ..
        } = step
        else {
            let resume = serde_json::to_value(step).unwrap_or_default();
            let reason = "this source replays only steps with journaled data".to_string();
            return Err(self.bad_resume("replay", &resume, reason));
        };
        let end = self.at("replay", position)?.seq;
        let bodies = unframe(data).map_err(|reason| self.bad_resume("replay", position, reason))?;
        check_replay(&self.name, step, hash(data))?;
        let (mut records, mut bytes) = (0, 0);
        for body in &bodies {
            push_records(&self.name, body.seq, &body.batch, out);
            records += body.batch.len();
            bytes += body.batch.bytes();
        }
        if let Phase::Positioning { last, replayed, .. } = &mut self.phase {
            // The interrupted transaction's bodies: their clients can be answered again.
            *last = (*last).max(end);
            // Counted as when they were accepted: the same check of the same documents.
            let intake = self.intake.as_ref();
            replayed.extend(bodies.into_iter().filter_map(|b| {
                let dead_lettered = b.batch.dead_lettered(intake);
                Some(Replayed {
                    key: b.key?,
                    seq: b.seq,
                    docs: b.batch.len() as u64 - dead_lettered,
                    dead_lettered,
                    at: b.at,
                })
            }));
        }
        Ok(Step {
            records,
            bytes,
            errors: Vec::new(),
            end_of_input: false,
            advances: false,
            unit_continues: false,
            resume: step.clone(),
        })
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let name = self.name.clone();
        let shared = self.serve().await?;
        shared.take(limits, out).map_err(|reason| SourceError::Io {
            name,
            path: "the idempotency keys file".to_string(),
            error: std::io::Error::other(reason),
        })
    }

    async fn ready(&mut self) {
        // Before serving, `queue` starts the server (or says why it cannot): at once.
        if let Phase::Serving { shared, .. } = &self.phase {
            shared.ready().await;
        }
    }

    fn queued(&self) -> Queued {
        match &self.phase {
            Phase::Serving { shared, .. } => shared.queued(),
            _ => Queued::default(),
        }
    }

    fn extend(&mut self) {
        self.paused = false;
        if let Phase::Serving { shared, .. } = &self.phase {
            shared.set_paused(false);
        }
    }

    fn pause(&mut self) {
        self.paused = true;
        if let Phase::Serving { shared, .. } = &self.phase {
            shared.set_paused(true);
        }
    }

    fn committed(&mut self, txn: u64, position: &Value) {
        let Ok(at) = self.at("commit", position) else {
            tracing::error!(source = self.name, %position, "a commit position this source did not produce");
            return;
        };
        let seq = at.seq;
        match &mut self.phase {
            Phase::Positioning { start, carried, .. } => {
                // The checkpoint recovery adopted: its keys are the ones that hold.
                *start = Some(StartCommit { txn, seq });
                *carried = at.keys;
            }
            Phase::Serving { shared, .. } => shared.commit(txn, seq),
            Phase::Stopped => {}
        }
    }

    async fn disconnect(&mut self) {
        if let Phase::Serving { shared, server } =
            std::mem::replace(&mut self.phase, Phase::Stopped)
        {
            let writer = shared.close("the pipeline is shutting down");
            server.stop().await;
            if let Some(writer) = writer {
                let _ = tokio::task::spawn_blocking(|| writer.join()).await;
            }
        }
    }
}

impl Drop for HttpSource {
    fn drop(&mut self) {
        // Dropped without a disconnect (its run failed): answer everyone, stop
        // listening; the writer thread ends after what it was handed.
        if let Phase::Serving { shared, server } = &mut self.phase {
            drop(shared.close("the pipeline's run stopped"));
            server.signal_stop();
        }
    }
}
