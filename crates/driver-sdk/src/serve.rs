//! The driver-side loop of one Transactions stream.
//!
//! ```text
//!  requests ─▶ Request::try_from ─▶ Machine::on_request ─▶ Transactor call ─┐
//!  responses ◀──────────── Machine::on_response (checks our own driver too) ◀┘
//! ```
//!
//! The loop handles one request at a time, in wire order. Consequences the transactor
//! can rely on:
//! - `load` of transaction T+1 runs only after `commit` of T has returned, so
//!   `prior_committed` always holds and those loads read committed. The runtime may send
//!   Loads of T+1 right after Commit of T, before it reads DriverCommitted (Flow's
//!   runtime loops to load while T commits); they wait in the request stream until the
//!   loop, its `commit` returned and DriverCommitted sent, reads them.
//! - For patterns whose loads await the acknowledgement
//!   ([`crate::CommitPattern::loads_await_acknowledge`]), Loads that arrive before the
//!   transaction's Acknowledge are queued and run, in order, right after `acknowledge`
//!   returns. The runtime keeps sending meanwhile, so no deadlock: the Acknowledge it
//!   sent will be read behind the queued Loads. The queue holds up to
//!   [`DEFERRED_IN_MEMORY`] bytes of Loads in memory and the rest in a temporary file
//!   ([`DeferredLoads`]), so a runtime that sends a whole transaction's Loads ahead of
//!   its Acknowledge never grows the driver without bound.
//! - Loaded documents are batched into bounded arena messages ([`LoadedBuilder`]); full
//!   messages are sent after each `load` and whenever the transactor asks
//!   ([`LoadedSink::send_full`]), the rest at Prepare, after `flush_loads` and before
//!   `prepare`, so every Loaded precedes Prepared.
//! - Any error (from the transactor, the runtime's message order, or the transport)
//!   stops the loop before anything else is called: a transaction in progress is never
//!   committed. `destroy` runs on every way out once `open` has succeeded.
//! - Fail points (`failpoints` feature) sit before each store, before and after commit,
//!   and before acknowledge (where an idempotent-apply driver applies).

use crate::arena::LoadedBuilder;
use crate::hooks::HookCall;
use crate::machine::{Ack, Machine, Phase, Request, Response, violation};
use crate::traits::LogContext;
use crate::{CommitPattern, Driver, Error, LoadedSink, Peer, PriorState, Result, Transactor};
use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use prost::Message;
use sluice_proto::materialize::{self as m, transaction_request::Load};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;

/// A fail point of the driver side (`failpoints` feature; the catalogue is
/// `sluice_runtime::failpoint`). Its `return` action fails the request as a lost
/// connection would, so the runtime reopens the stream.
macro_rules! fail_point {
    ($name:literal) => {
        ::fail::fail_point!($name, |_| Err(Error::Transport(format!(
            "injected by fail point {}",
            $name
        ))))
    };
}

/// Runs one Transactions stream of `driver`: checks each request against the protocol
/// state machine, calls the transactor, sends responses. Returns Ok when the runtime
/// closes the stream between transactions; any error ends the stream (the transport
/// reports it to the peer) and rolls back the transaction in progress.
pub async fn serve_transactions(
    driver: Arc<dyn Driver>,
    requests: BoxStream<'static, Result<m::TransactionRequest>>,
    responses: mpsc::Sender<m::TransactionResponse>,
) -> Result<()> {
    serve(
        driver,
        Inbox {
            requests,
            hooks: None,
        },
        responses,
    )
    .await
}

/// [`serve_transactions`] in process, also serving the calls beside the protocol.
pub(crate) async fn serve_in_process(
    driver: Arc<dyn Driver>,
    requests: BoxStream<'static, Result<m::TransactionRequest>>,
    hooks: mpsc::Receiver<HookCall>,
    responses: mpsc::Sender<m::TransactionResponse>,
) -> Result<()> {
    let hooks = Some(hooks);
    serve(driver, Inbox { requests, hooks }, responses).await
}

async fn serve(
    driver: Arc<dyn Driver>,
    mut inbox: Inbox,
    responses: mpsc::Sender<m::TransactionResponse>,
) -> Result<()> {
    let mut out = Responses {
        machine: Machine::new(),
        tx: responses,
        commit_checkpoint: None,
    };
    let mut log = LogContext::default();
    let open = loop {
        match inbox.next().await {
            Received::Hook(HookCall::Opening(context, reply)) => {
                log = context;
                let _ = reply.send(());
            }
            // Nothing to report yet.
            Received::Hook(HookCall::Report(reply)) => _ = reply.send(Default::default()),
            // Dropped unanswered: the caller learns no transactor is open.
            Received::Hook(_) => {}
            Received::Request(raw) => break out.check(raw)?,
        }
    };
    let Some(open) = open else {
        return Ok(());
    };
    let Request::Open(open) = open else {
        // Not reached: the machine accepts only Open first.
        return Err(violation(Peer::Runtime, "Open", open.name()).into());
    };
    let pattern = driver.declared().pattern;
    let (transactor, opened) = driver.open_with_log(open, log).await?;
    let mut session = Session {
        pattern,
        gate: LoadGate::new(pattern),
        transactor,
        loaded: LoadedBuilder::new(),
        out,
    };
    let result = session.run(opened, &mut inbox).await;
    session.transactor.destroy().await;
    result
}

/// What reaches the serve loop: the runtime's requests and, in process, its calls
/// beside the protocol.
struct Inbox {
    requests: BoxStream<'static, Result<m::TransactionRequest>>,
    hooks: Option<mpsc::Receiver<HookCall>>,
}

// Moved once per request, straight into the machine's check: boxing it would allocate
// for every request of the hot path to save stack on the rare hook call.
#[allow(clippy::large_enum_variant)]
enum Received {
    /// The next request; `None` when the runtime closed the stream.
    Request(Option<Result<m::TransactionRequest>>),
    Hook(HookCall),
}

impl Inbox {
    async fn next(&mut self) -> Received {
        let Some(hooks) = &mut self.hooks else {
            return Received::Request(self.requests.next().await);
        };
        tokio::select! {
            biased;
            raw = self.requests.next() => Received::Request(raw),
            Some(call) = hooks.recv() => Received::Hook(call),
        }
    }
}

/// The response half, with the machine that sees both directions in wire order.
struct Responses {
    machine: Machine,
    tx: mpsc::Sender<m::TransactionResponse>,
    /// The runtime checkpoint the last Commit carried (Sluice's extension, set when the
    /// runtime speaks the current protocol), for [`Transactor::commit_checkpoint`].
    commit_checkpoint: Option<Vec<u8>>,
}

impl Responses {
    /// A request read from the stream, checked; None if the runtime closed the stream
    /// where that is allowed.
    fn check(&mut self, raw: Option<Result<m::TransactionRequest>>) -> Result<Option<Request>> {
        let mut raw = match raw {
            Some(raw) => raw?,
            None if self.machine.may_close() || self.machine.phase() == Phase::AwaitingOpen => {
                return Ok(None);
            }
            None => {
                return Err(Error::Transport(format!(
                    "the runtime closed the Transactions stream {}",
                    self.machine.describe()
                )));
            }
        };
        self.commit_checkpoint = (raw.commit.as_mut())
            .map(|commit| std::mem::take(&mut commit.flow_checkpoint))
            .filter(|checkpoint| !checkpoint.is_empty());
        let req = Request::try_from(raw)?;
        self.machine = std::mem::take(&mut self.machine).on_request(&req)?;
        Ok(Some(req))
    }

    async fn send(&mut self, resp: Response) -> Result<()> {
        self.machine = std::mem::take(&mut self.machine).on_response(&resp)?;
        self.tx.send(resp.into()).await.map_err(|_| {
            Error::Transport(format!(
                "the runtime stopped reading responses {}",
                self.machine.describe()
            ))
        })
    }
}

/// Whether Loads may run now or must wait for this transaction's `acknowledge`.
enum LoadGate {
    /// Loads run as they arrive.
    Open,
    /// Loads are queued until `acknowledge` returns.
    AwaitingAcknowledge(DeferredLoads),
}

impl LoadGate {
    fn new(pattern: CommitPattern) -> Self {
        if pattern.loads_await_acknowledge() {
            LoadGate::AwaitingAcknowledge(DeferredLoads::default())
        } else {
            LoadGate::Open
        }
    }
}

/// Bytes of deferred Loads (their arenas) held in memory before the rest go to a
/// temporary file.
pub const DEFERRED_IN_MEMORY: usize = 16 << 20;

/// Loads waiting for `acknowledge`, in arrival order: the first
/// [`DEFERRED_IN_MEMORY`] bytes in memory, every later one in a temporary file (each as
/// a little-endian u32 length and the encoded message), read back after the ones in
/// memory.
#[derive(Default)]
struct DeferredLoads {
    memory: std::collections::VecDeque<Load>,
    memory_bytes: usize,
    spilled: Option<SpilledLoads>,
}

struct SpilledLoads {
    writer: BufWriter<tokio::fs::File>,
    count: u64,
}

impl DeferredLoads {
    async fn push(&mut self, load: Load) -> Result<()> {
        let size = load.arena.len() + 8 * load.packed_keys.len();
        if self.spilled.is_none() && self.memory_bytes + size <= DEFERRED_IN_MEMORY {
            self.memory_bytes += size;
            self.memory.push_back(load);
            return Ok(());
        }
        let spilled = match &mut self.spilled {
            Some(spilled) => spilled,
            None => {
                let file = tokio::task::spawn_blocking(tempfile::tempfile)
                    .await
                    .map_err(|e| spill_error("creating", e))?
                    .map_err(|e| spill_error("creating", e))?;
                self.spilled.insert(SpilledLoads {
                    writer: BufWriter::new(tokio::fs::File::from_std(file)),
                    count: 0,
                })
            }
        };
        let encoded = load.encode_to_vec();
        let len = u32::try_from(encoded.len())
            .map_err(|_| spill_error("writing", "a Load of 4 GiB or more"))?;
        spilled
            .writer
            .write_all(&len.to_le_bytes())
            .await
            .map_err(|e| spill_error("writing", e))?;
        (spilled.writer.write_all(&encoded).await).map_err(|e| spill_error("writing", e))?;
        spilled.count += 1;
        Ok(())
    }

    /// Runs every deferred Load on `session`, in arrival order.
    async fn drain(mut self, session: &mut Session) -> Result<()> {
        while let Some(load) = self.memory.pop_front() {
            session.load(load, true).await?;
        }
        let Some(SpilledLoads { mut writer, count }) = self.spilled else {
            return Ok(());
        };
        writer
            .flush()
            .await
            .map_err(|e| spill_error("writing", e))?;
        let mut file = writer.into_inner();
        (file.rewind().await).map_err(|e| spill_error("reading", e))?;
        let mut reader = BufReader::new(file);
        let mut encoded = Vec::new();
        for _ in 0..count {
            let len = reader.read_u32_le().await;
            let len = len.map_err(|e| spill_error("reading", e))?;
            encoded.resize(len as usize, 0);
            (reader.read_exact(&mut encoded).await).map_err(|e| spill_error("reading", e))?;
            let load = Load::decode(encoded.as_slice()).map_err(|e| spill_error("reading", e))?;
            session.load(load, true).await?;
        }
        Ok(())
    }
}

fn spill_error(action: &str, err: impl std::fmt::Display) -> Error {
    Error::store(
        format!("{action} the temporary file of Loads deferred until Acknowledge"),
        err,
        true,
    )
}

/// What a transactor loads into: the stream's [`LoadedBuilder`], whose full messages
/// go out to the runtime whenever the transactor asks.
struct LoadedOut<'a> {
    builder: &'a mut LoadedBuilder,
    out: &'a mut Responses,
}

#[async_trait]
impl LoadedSink for LoadedOut<'_> {
    fn push(&mut self, binding: u32, doc_json: &[u8]) {
        self.builder.push(binding, doc_json);
    }

    async fn send_full(&mut self) -> Result<()> {
        for loaded in self.builder.take_ready() {
            self.out.send(Response::Loaded(loaded)).await?;
        }
        Ok(())
    }
}

struct Session {
    transactor: Box<dyn Transactor>,
    /// The driver's declared pattern: whether Loads wait for `acknowledge`.
    pattern: CommitPattern,
    gate: LoadGate,
    loaded: LoadedBuilder,
    out: Responses,
}

impl Session {
    async fn run(
        &mut self,
        opened: m::transaction_response::Opened,
        inbox: &mut Inbox,
    ) -> Result<()> {
        self.out.send(Response::Opened(opened)).await?;
        loop {
            let req = match inbox.next().await {
                Received::Hook(call) => {
                    self.hook(call).await;
                    continue;
                }
                Received::Request(raw) => match self.out.check(raw)? {
                    Some(req) => req,
                    None => break,
                },
            };
            match req {
                Request::Acknowledge => {
                    fail_point!("driver::acknowledge");
                    self.transactor.acknowledge().await?;
                    let state = self.transactor.acknowledged_state();
                    self.out.send(Response::Acknowledged(state)).await?;
                    if let LoadGate::AwaitingAcknowledge(deferred) =
                        std::mem::replace(&mut self.gate, LoadGate::Open)
                    {
                        deferred.drain(self).await?;
                    }
                }
                Request::Load(load) => match &mut self.gate {
                    LoadGate::AwaitingAcknowledge(deferred) => deferred.push(load).await?,
                    LoadGate::Open => {
                        let acknowledged = self.acknowledged();
                        self.load(load, acknowledged).await?;
                    }
                },
                Request::Prepare(prepare) => {
                    let mut sink = LoadedOut {
                        builder: &mut self.loaded,
                        out: &mut self.out,
                    };
                    self.transactor.flush_loads(&mut sink).await?;
                    let rest = self.loaded.finish();
                    self.send_loaded(rest).await?;
                    let checkpoint = self.transactor.prepare(prepare).await?;
                    self.out.send(Response::Prepared(checkpoint)).await?;
                }
                Request::Store(store) => {
                    fail_point!("driver::store");
                    self.transactor.store(store).await?
                }
                Request::Commit => {
                    if let Some(checkpoint) = self.out.commit_checkpoint.take() {
                        self.transactor.commit_checkpoint(checkpoint);
                    }
                    fail_point!("driver::before-commit");
                    self.transactor.commit().await?;
                    fail_point!("driver::after-commit");
                    let state = self.transactor.committed_state();
                    self.out.send(Response::DriverCommitted(state)).await?;
                    self.gate = LoadGate::new(self.pattern);
                }
                // Not reached: the machine accepts Open only as the first request.
                Request::Open(_) => {
                    return Err(violation(Peer::Runtime, "no second Open", "Open").into());
                }
            }
        }
        Ok(())
    }

    /// Serves a call beside the protocol. A second Opening is answered and ignored: the
    /// log it describes was read at Open.
    async fn hook(&mut self, call: HookCall) {
        // A caller that stopped waiting has nothing to be told: sends may fail.
        match call {
            HookCall::Opening(_, reply) => _ = reply.send(()),
            HookCall::ArtifactIntent(txn, reply) => {
                _ = reply.send(self.transactor.artifact_intent(txn).await)
            }
            HookCall::Decision(txn, reply) => _ = reply.send(self.transactor.decision(txn)),
            HookCall::Report(reply) => _ = reply.send(self.transactor.report()),
        }
    }

    /// Whether this transaction's `acknowledge` has returned.
    fn acknowledged(&self) -> bool {
        matches!(
            self.out.machine.phase(),
            Phase::Loading { ack: Ack::Done, .. }
        )
    }

    async fn load(&mut self, load: Load, prior_acknowledged: bool) -> Result<()> {
        let prior = PriorState {
            prior_committed: true,
            prior_acknowledged,
        };
        let mut sink = LoadedOut {
            builder: &mut self.loaded,
            out: &mut self.out,
        };
        self.transactor.load(load, prior, &mut sink).await?;
        sink.send_full().await
    }

    async fn send_loaded(&mut self, messages: Vec<m::transaction_response::Loaded>) -> Result<()> {
        for loaded in messages {
            self.out.send(Response::Loaded(loaded)).await?;
        }
        Ok(())
    }
}
