//! The stdio transport: a driver that is a plain executable, both sides.
//!
//! ```text
//!   runtime ── StdioEndpoint ──spawn──▶ PROGRAM ARGS... <sub-command>
//!                 stdin  ──▶ frames: u32 little-endian length ‖ protobuf message
//!                 stdout ◀── frames
//!                 stderr ◀── lines, forwarded to `tracing` with the driver's name
//! ```
//!
//! Sub-commands: `spec`, `validate`, `apply-upsert`, `apply-delete` (one request frame,
//! one response frame, then the process exits) and `transactions` (a stream of frames
//! each way until the runtime closes stdin).
//!
//! Invariants:
//! - Never a hang on a broken peer: a stdout that ends mid-frame, a frame longer than
//!   [`MAX_WIRE_MESSAGE_BYTES`] (checked before allocating) and bytes that are not the expected
//!   protobuf message are all errors naming the driver. When the child is gone, the
//!   error carries its exit status and the last lines of its stderr.
//! - The child is killed when the endpoint's stream (or unary call) is dropped
//!   (`kill_on_drop`): a runtime that gives up never leaves a driver behind.
//! - A Transactions stream ends cleanly only if the runtime closed its side first and the
//!   child then exited with success; any other exit is an error.
//! - A driver's error keeps its kind: a failing call's last stderr line is
//!   `sluice-driver-error {"kind": …, "message": …}` ([`RemoteKind`]), which the runtime
//!   reads back as the same [`Error`] variant (a fenced commit is `Fenced`, as in-process
//!   and over gRPC). A process that exits without one is a transport error.
//!
//! [`serve_stdio`] is the driver side: it lets any [`Driver`] act as such an executable.

use crate::grpc::MAX_WIRE_MESSAGE_BYTES;
use crate::serve::serve_transactions;
use crate::{Driver, Endpoint, Error, RemoteKind, Result, TransactionStream};
use async_trait::async_trait;
use futures::StreamExt;
use prost::Message;
use sluice_proto::materialize as m;
use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// How many trailing stderr lines an error about a failed driver quotes.
const STDERR_TAIL_LINES: usize = 20;

/// Messages buffered between the runtime and the writer task of a Transactions stream.
const STREAM_BUFFER: usize = 32;

/// A framing failure, before the driver's name is attached.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("stream ended inside a frame ({got} of {expected} bytes read)")]
    Truncated { expected: usize, got: usize },
    #[error("malformed {message} frame: {source}")]
    Malformed {
        message: &'static str,
        source: prost::DecodeError,
    },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one length-prefixed frame holding `msg`, and flushes.
pub async fn write_frame<W, M>(out: &mut W, msg: &M) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    M: Message,
{
    let buf = encode_frame(msg)?;
    out.write_all(&buf).await?;
    out.flush().await?;
    Ok(())
}

/// The frame [`write_frame`] writes: `msg`'s length as a little-endian u32, then `msg`.
pub fn encode_frame<M: Message>(msg: &M) -> Result<Vec<u8>, FrameError> {
    let len = msg.encoded_len();
    if len > MAX_WIRE_MESSAGE_BYTES {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_WIRE_MESSAGE_BYTES,
        });
    }
    let mut buf = Vec::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(&mut buf)
        .expect("a Vec grows to fit the message");
    Ok(buf)
}

/// Reads one frame and decodes it as `M`. `Ok(None)` is a clean end of stream: EOF
/// exactly at a frame boundary.
pub async fn read_frame<R, M>(input: &mut R) -> Result<Option<M>, FrameError>
where
    R: AsyncRead + Unpin,
    M: Message + Default,
{
    let mut prefix = [0u8; 4];
    let got = read_full(input, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < prefix.len() {
        return Err(FrameError::Truncated { expected: 4, got });
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_WIRE_MESSAGE_BYTES {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_WIRE_MESSAGE_BYTES,
        });
    }
    let mut body = vec![0u8; len];
    let got = read_full(input, &mut body).await?;
    if got < len {
        return Err(FrameError::Truncated { expected: len, got });
    }
    let message = M::decode(body.as_slice()).map_err(|source| FrameError::Malformed {
        message: std::any::type_name::<M>()
            .rsplit("::")
            .next()
            .unwrap_or("protobuf"),
        source,
    })?;
    Ok(Some(message))
}

/// Fills `buf` unless EOF comes first; returns how many bytes were read.
async fn read_full<R: AsyncRead + Unpin>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// The sub-command a stdio driver is started with: one per protocol call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubCommand {
    Spec,
    Validate,
    ApplyUpsert,
    ApplyDelete,
    Transactions,
}

impl SubCommand {
    pub const ALL: [SubCommand; 5] = [
        SubCommand::Spec,
        SubCommand::Validate,
        SubCommand::ApplyUpsert,
        SubCommand::ApplyDelete,
        SubCommand::Transactions,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SubCommand::Spec => "spec",
            SubCommand::Validate => "validate",
            SubCommand::ApplyUpsert => "apply-upsert",
            SubCommand::ApplyDelete => "apply-delete",
            SubCommand::Transactions => "transactions",
        }
    }
}

impl std::str::FromStr for SubCommand {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|sub| sub.as_str() == s)
            .ok_or_else(|| {
                Error::Config(format!(
                    "unknown stdio sub-command {s:?}; expected one of spec, validate, \
                     apply-upsert, apply-delete, transactions"
                ))
            })
    }
}

/// The runtime's view of a driver that is an executable speaking the stdio protocol.
pub struct StdioEndpoint {
    name: String,
    program: String,
    args: Vec<String>,
}

/// A started driver process, its stderr being forwarded. Killed when dropped.
pub(crate) struct Started {
    child: Child,
    /// Resolves to the last stderr lines once stderr closes (the process has exited).
    stderr_tail: JoinHandle<Vec<String>>,
}

/// Starts driver `name` as `program args... [sub]`, its stdin and stdout piped, its
/// stderr forwarded to `tracing` ([`forward_stderr`]).
pub(crate) fn spawn(
    name: &str,
    program: &str,
    args: &[String],
    sub: Option<&str>,
) -> Result<(Started, ChildStdin, ChildStdout)> {
    let mut child = Command::new(program)
        .args(args)
        .args(sub)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| {
            let sub = sub.map(|sub| format!(" {sub}")).unwrap_or_default();
            Error::Transport(format!("driver {name}: cannot start {program}{sub}: {err}"))
        })?;
    let (stdin, stdout, stderr) = (
        child.stdin.take().expect("stdin is piped"),
        child.stdout.take().expect("stdout is piped"),
        child.stderr.take().expect("stderr is piped"),
    );
    let stderr_tail = tokio::spawn(forward_stderr(name.to_string(), stderr).in_current_span());
    Ok((Started { child, stderr_tail }, stdin, stdout))
}

impl StdioEndpoint {
    /// `name` labels logs and errors; the driver runs as `program args... <sub-command>`.
    pub fn new(name: impl Into<String>, program: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args,
        }
    }

    fn start(&self, sub: SubCommand) -> Result<(Started, ChildStdin, ChildStdout)> {
        spawn(&self.name, &self.program, &self.args, Some(sub.as_str()))
    }

    /// One request frame, one response frame, then the process must exit with success.
    async fn unary<Req: Message, Resp: Message + Default>(
        &self,
        sub: SubCommand,
        req: Req,
    ) -> Result<Resp> {
        let (started, mut stdin, mut stdout) = self.start(sub)?;
        // A driver may exit before reading its request; its exit status and response (or
        // lack of one) then say more than the broken pipe, so they are reported first.
        let written = write_frame(&mut stdin, &req).await;
        drop(stdin);
        let read = read_frame::<_, Resp>(&mut stdout).await;
        let (status, tail) = started.finish().await;
        let failure = |what: String| process_error(&self.name, sub.as_str(), &what, &status, &tail);
        if !status.as_ref().is_ok_and(|status| status.success()) {
            return Err(failure("exited".into()));
        }
        match (read, written) {
            (Ok(Some(response)), Ok(())) => Ok(response),
            (Ok(Some(_)), Err(err)) => Err(failure(format!(
                "answered without reading its whole request: {err}"
            ))),
            // Whether writing the request failed too is a matter of timing: not reported.
            (Ok(None), _) => Err(failure("exited without a response".into())),
            (Err(err), _) => Err(failure(format!("bad response: {err}"))),
        }
    }
}

/// What a failing driver writes as its last stderr line, before the error as JSON.
const ERROR_LINE: &str = "sluice-driver-error ";

/// The error line of `err`, as [`serve_stdio`] writes it.
fn error_line(err: &Error) -> String {
    let (kind, message) = err.remote();
    let body = serde_json::json!({"kind": kind.name(), "message": message});
    format!("{ERROR_LINE}{body}")
}

/// Writes `err`'s error line to this process's stderr: what a driver process does last
/// when it fails, so the runtime reads the error back as the same kind.
pub(crate) async fn report_error(err: &Error) {
    let mut stderr = tokio::io::stderr();
    let line = format!("{}\n", error_line(err));
    // Nothing else can be told if stderr is gone too.
    let _ = stderr.write_all(line.as_bytes()).await;
    let _ = stderr.flush().await;
}

/// The error the last error line of `tail` reports, if any.
fn reported_error(peer: &str, tail: &[String]) -> Option<Error> {
    let line = tail
        .iter()
        .rev()
        .find_map(|line| line.strip_prefix(ERROR_LINE))?;
    let body: serde_json::Value = serde_json::from_str(line).ok()?;
    let kind = RemoteKind::from_name(body["kind"].as_str()?)?;
    let message = body["message"].as_str()?.to_owned();
    Some(Error::from_remote(kind, peer, message))
}

/// An error about driver process `name` serving `call` (its sub-command, or the call of
/// a current-protocol driver): the error it reported, else what went wrong, its exit
/// status and its stderr tail.
fn process_error(
    name: &str,
    call: &str,
    what: &str,
    status: &std::io::Result<ExitStatus>,
    tail: &[String],
) -> Error {
    let peer = format!("driver {name} ({call})");
    if let Some(reported) = reported_error(&peer, tail) {
        return reported;
    }
    let status = match status {
        Ok(status) => status.to_string(),
        Err(err) => format!("exit status unknown: {err}"),
    };
    let mut message = format!("{peer}: {what} ({status})");
    if !tail.is_empty() {
        message.push_str("; stderr:\n");
        message.push_str(&tail.join("\n"));
    }
    Error::Transport(message)
}

impl Started {
    /// Waits for the process to exit and for its stderr to close.
    async fn finish(mut self) -> (std::io::Result<ExitStatus>, Vec<String>) {
        let status = self.child.wait().await;
        let tail = self.stderr_tail.await.unwrap_or_default();
        (status, tail)
    }

    /// Once a driver's stream of responses to `call` ended (`bad`: on a response that
    /// could not be read, else at the end of stdout), waits for the process: `None` if
    /// the end was clean (the runtime had closed its side, stdout ended at a message
    /// boundary, and the process exited with success), else the error to report.
    pub(crate) async fn end(
        self,
        name: &str,
        call: &str,
        bad: Option<String>,
        runtime_closed: bool,
    ) -> Option<Error> {
        let (status, tail) = self.finish().await;
        let success = status.as_ref().is_ok_and(|status| status.success());
        let what = match bad {
            None if runtime_closed && success => return None,
            Some(bad) => format!("bad response: {bad}"),
            None => "exited mid-stream".to_string(),
        };
        Some(process_error(name, call, &what, &status, &tail))
    }
}

/// Forwards each stderr line to `tracing`, returning the last [`STDERR_TAIL_LINES`].
async fn forward_stderr(name: String, stderr: tokio::process::ChildStderr) -> Vec<String> {
    let mut lines = BufReader::new(stderr).lines();
    let mut tail = VecDeque::with_capacity(STDERR_TAIL_LINES);
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(driver = %name, "{line}");
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    tail.into()
}

#[async_trait]
impl Endpoint for StdioEndpoint {
    fn name(&self) -> &str {
        &self.name
    }

    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        self.unary(SubCommand::Spec, req).await
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.unary(SubCommand::Validate, req).await
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.unary(SubCommand::ApplyUpsert, req).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.unary(SubCommand::ApplyDelete, req).await
    }

    /// A writer task copies requests to stdin; the response stream reads stdout and owns
    /// the child, so dropping the stream kills it.
    async fn transactions(&self) -> Result<TransactionStream> {
        let sub = SubCommand::Transactions;
        let (started, stdin, stdout) = self.start(sub)?;
        let (requests, requests_rx) = mpsc::channel(STREAM_BUFFER);
        let runtime_closed = Arc::new(AtomicBool::new(false));
        tokio::spawn(write_requests(
            self.name.clone(),
            requests_rx,
            stdin,
            runtime_closed.clone(),
            encode_frame,
        ));
        let name = self.name.clone();
        let responses = futures::stream::unfold(Some((started, stdout)), move |state| {
            let (name, runtime_closed) = (name.clone(), runtime_closed.clone());
            async move {
                let (started, mut stdout) = state?;
                let bad = match read_frame::<_, m::TransactionResponse>(&mut stdout).await {
                    Ok(Some(response)) => return Some((Ok(response), Some((started, stdout)))),
                    Ok(None) => None,
                    Err(err) => Some(err.to_string()),
                };
                let closed = runtime_closed.load(Ordering::Acquire);
                let err = started.end(&name, sub.as_str(), bad, closed).await?;
                Some((Err(err), None))
            }
        })
        .boxed();
        Ok(TransactionStream {
            requests,
            responses,
            hooks: None,
        })
    }
}

/// Copies requests to the child's stdin, each as `encode` writes it, until the runtime
/// closes its sender (then closes stdin, the driver's signal to finish; `runtime_closed`
/// says so) or the child stops reading.
pub(crate) async fn write_requests<M>(
    name: String,
    mut requests: mpsc::Receiver<M>,
    mut stdin: ChildStdin,
    runtime_closed: Arc<AtomicBool>,
    encode: impl Fn(&M) -> Result<Vec<u8>, FrameError>,
) {
    while let Some(request) = requests.recv().await {
        let written = match encode(&request) {
            Ok(bytes) => write_all(&mut stdin, &bytes).await,
            Err(err) => Err(err),
        };
        if let Err(err) = written {
            // The reader side reports the child's exit; this only explains the write.
            tracing::debug!(driver = %name, error = %err, "stopped writing requests");
            return;
        }
    }
    runtime_closed.store(true, Ordering::Release);
}

/// Writes `bytes` and flushes.
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(
    out: &mut W,
    bytes: &[u8],
) -> Result<(), FrameError> {
    out.write_all(bytes).await?;
    out.flush().await?;
    Ok(())
}

/// The driver side of the stdio protocol: serves `sub_command` of `driver` on this
/// process's stdin and stdout. Returns when the call is answered (unary) or the runtime
/// closes stdin (transactions). A failure has been written to stderr as its error line
/// when it returns; the process should then exit non-zero.
pub async fn serve_stdio(driver: Arc<dyn Driver>, sub_command: SubCommand) -> Result<()> {
    let served = serve(driver, sub_command).await;
    if let Err(err) = &served {
        report_error(err).await;
    }
    served
}

async fn serve(driver: Arc<dyn Driver>, sub_command: SubCommand) -> Result<()> {
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    match sub_command {
        SubCommand::Spec => {
            let req = read_request(&mut stdin).await?;
            write_response(&mut stdout, &driver.spec(req).await?).await
        }
        SubCommand::Validate => {
            let req = read_request(&mut stdin).await?;
            write_response(&mut stdout, &driver.validate(req).await?).await
        }
        SubCommand::ApplyUpsert => {
            let req = read_request(&mut stdin).await?;
            write_response(&mut stdout, &driver.apply_upsert(req).await?).await
        }
        SubCommand::ApplyDelete => {
            let req = read_request(&mut stdin).await?;
            write_response(&mut stdout, &driver.apply_delete(req).await?).await
        }
        SubCommand::Transactions => {
            let requests = futures::stream::unfold(Some(stdin), |stdin| async move {
                let mut stdin = stdin?;
                match read_frame::<_, m::TransactionRequest>(&mut stdin).await {
                    Ok(Some(request)) => Some((Ok(request), Some(stdin))),
                    Ok(None) => None,
                    Err(err) => Some((Err(runtime_frame_error(err)), None)),
                }
            })
            .boxed();
            let (responses, responses_rx) = mpsc::channel(STREAM_BUFFER);
            let writer = tokio::spawn(write_responses(responses_rx, encode_frame));
            let served = serve_transactions(driver, requests, responses).await;
            let written = writer
                .await
                .map_err(|err| Error::Transport(format!("stdout writer panicked: {err}")))?;
            served.and(written)
        }
    }
}

/// Copies responses to this process's stdout, each as `encode` writes it, until their
/// sender closes.
pub(crate) async fn write_responses<M>(
    mut responses: mpsc::Receiver<M>,
    encode: impl Fn(&M) -> Result<Vec<u8>, FrameError>,
) -> Result<()> {
    let mut stdout = tokio::io::stdout();
    while let Some(response) = responses.recv().await {
        let written = match encode(&response) {
            Ok(bytes) => write_all(&mut stdout, &bytes).await,
            Err(err) => Err(err),
        };
        written.map_err(|err| Error::Transport(format!("writing a response to stdout: {err}")))?;
    }
    Ok(())
}

async fn read_request<M: Message + Default>(stdin: &mut tokio::io::Stdin) -> Result<M> {
    read_frame(stdin)
        .await
        .map_err(runtime_frame_error)?
        .ok_or_else(|| Error::Transport("stdin closed before the request arrived".into()))
}

async fn write_response<M: Message>(stdout: &mut tokio::io::Stdout, msg: &M) -> Result<()> {
    write_frame(stdout, msg)
        .await
        .map_err(|err| Error::Transport(format!("writing a response to stdout: {err}")))
}

/// The error a request that could not be read from stdin ends the driver with.
pub(crate) fn runtime_frame_error(err: impl std::fmt::Display) -> Error {
    Error::Transport(format!("reading a request from stdin: {err}"))
}
