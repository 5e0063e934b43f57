//! The current protocol over a child process's stdin and stdout, both sides.
//!
//! ```text
//!   runtime ── CurrentCommand ──spawn──▶ PROGRAM ARGS...        (no sub-command)
//!                 stdin  ──▶ Requests, in the codec: proto frames (u32 LE length ‖
//!                            protobuf) or JSON lines (one object a line)
//!                 stdout ◀── Responses, in the same codec
//!                 stderr ◀── lines, forwarded to `tracing`; the last error line decoded
//! ```
//!
//! One process per stream, as with the seed's stdio drivers ([`crate::stdio`], whose
//! process handling, error lines and framing this reuses): the first request says what
//! is asked. Spec, Validate and Apply close stdin after their request, read one
//! response, and the process must then exit with success; a Transactions stream ends
//! cleanly only if the runtime closed stdin first and the process then exited with
//! success.
//!
//! A JSON line is read up to [`MAX_WIRE_MESSAGE_BYTES`] (and then refused), as a frame
//! is; a stdout that ends inside a line is truncated, as one that ends inside a frame.
//!
//! Detection ([`detect`]): the program run this way with a Spec request; an answer of
//! the current protocol decides, else the seed's `PROGRAM ARGS... spec` is tried, and if
//! it fails too the error names both attempts.

use super::endpoint::{CurrentEndpoint, Detecting, Duplex, Transport, is_current};
use super::serve::serve_current;
use super::{Codec, Protocol, json};
use crate::grpc::{MAX_WIRE_MESSAGE_BYTES, STREAM_BUFFER};
use crate::stdio::{
    self as seed, FrameError, StdioEndpoint, encode_frame, read_frame, report_error,
    runtime_frame_error, write_requests, write_responses,
};
use crate::{Driver, Endpoint, Error, Result};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use prost::Message;
use sluice_proto::materialize as m;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

impl Codec {
    /// `msg` as this codec writes it; `json` is the JSON codec's encoder of its type.
    fn encode<M: Message>(self, msg: &M, json: fn(&M) -> Vec<u8>) -> Result<Vec<u8>, FrameError> {
        match self {
            Codec::Proto => encode_frame(msg),
            Codec::Json => {
                let mut line = json(msg);
                if line.len() > MAX_WIRE_MESSAGE_BYTES {
                    return Err(FrameError::TooLarge {
                        len: line.len(),
                        max: MAX_WIRE_MESSAGE_BYTES,
                    });
                }
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                Ok(line)
            }
        }
    }

    /// The next message in this codec, `Ok(None)` at a clean end of `input` (at a
    /// message boundary); `json` is the JSON codec's decoder of its type.
    async fn read<M, R>(
        self,
        input: &mut R,
        json: fn(&[u8]) -> std::result::Result<M, String>,
    ) -> std::result::Result<Option<M>, String>
    where
        M: Message + Default,
        R: AsyncBufRead + Unpin,
    {
        match self {
            Codec::Proto => read_frame(input).await.map_err(|err| err.to_string()),
            Codec::Json => loop {
                let mut line = Vec::new();
                let limit = MAX_WIRE_MESSAGE_BYTES as u64 + 1;
                let read = (&mut *input).take(limit).read_until(b'\n', &mut line).await;
                let got = read.map_err(|err| format!("i/o: {err}"))?;
                if got == 0 {
                    return Ok(None);
                }
                if line.len() > MAX_WIRE_MESSAGE_BYTES {
                    return Err(format!(
                        "JSON line exceeds the maximum of {MAX_WIRE_MESSAGE_BYTES} bytes"
                    ));
                }
                if line.pop() != Some(b'\n') {
                    return Err(format!("stream ended inside a JSON line ({got} bytes)"));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return json(&line).map(Some);
            },
        }
    }
}

/// The current protocol's transport to an executable: `program args...`, no
/// sub-command, messages in `codec`.
pub struct CurrentCommand {
    name: String,
    program: String,
    args: Vec<String>,
    codec: Codec,
}

impl CurrentCommand {
    /// `name` labels logs and errors.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<String>,
        args: Vec<String>,
        codec: Codec,
    ) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args,
            codec,
        }
    }
}

#[async_trait]
impl Transport for CurrentCommand {
    /// A writer task copies requests to stdin; the response stream reads stdout and owns
    /// the child, so dropping the stream kills it.
    async fn open(&self, call: &'static str) -> Result<Duplex> {
        let (started, stdin, stdout) = seed::spawn(&self.name, &self.program, &self.args, None)?;
        let (requests, requests_rx) = mpsc::channel(STREAM_BUFFER);
        let runtime_closed = Arc::new(AtomicBool::new(false));
        let codec = self.codec;
        tokio::spawn(write_requests(
            self.name.clone(),
            requests_rx,
            stdin,
            runtime_closed.clone(),
            move |request| codec.encode(request, json::encode_request),
        ));
        let (name, call) = (self.name.clone(), format!("{call}, current protocol"));
        let stdout = BufReader::new(stdout);
        let responses = futures::stream::unfold(Some((started, stdout)), move |state| {
            let (name, call, runtime_closed) = (name.clone(), call.clone(), runtime_closed.clone());
            async move {
                let (started, mut stdout) = state?;
                let bad = match codec.read(&mut stdout, json::decode_response).await {
                    Ok(Some(response)) => return Some((Ok(response), Some((started, stdout)))),
                    Ok(None) => None,
                    Err(bad) => Some(bad),
                };
                let closed = runtime_closed.load(Ordering::Acquire);
                let err = started.end(&name, &call, bad, closed).await?;
                Some((Err(err), None))
            }
        })
        .boxed();
        Ok(Duplex {
            requests,
            responses,
        })
    }
}

/// Which protocol the executable `program args...` speaks: run with no sub-command and
/// a Spec request in `codec`, an answer of the current protocol decides; else the seed's
/// `program args... spec` must answer. Fails naming both attempts when neither does.
pub async fn detect(name: &str, program: &str, args: &[String], codec: Codec) -> Result<Protocol> {
    let current = CurrentEndpoint::new(
        name,
        CurrentCommand::new(name, program, args.to_vec(), codec),
    );
    let first = match current.probe().await {
        Ok(response) => match is_current(&response) {
            Ok(()) => return Ok(Protocol::Current),
            Err(what) => what,
        },
        Err(err) => err.to_string(),
    };
    let seed = StdioEndpoint::new(name, program, args.to_vec());
    match seed.spec(m::SpecRequest::default()).await {
        Ok(_) => Ok(Protocol::Transactions),
        Err(second) => Err(Error::Transport(format!(
            "driver {name} speaks neither protocol: run as `{program}` with a Spec request \
             of the current protocol ({codec} codec), it failed: {first}; run as \
             `{program} spec` (the seed's protocol), it failed: {second}"
        ))),
    }
}

/// The runtime's endpoint for the executable `program args...`: of `protocol`, or, if
/// `None`, of the protocol it answers [`detect`] with before its first call. `codec`
/// is for the current protocol only.
pub fn endpoint(
    name: &str,
    program: &str,
    args: Vec<String>,
    protocol: Option<Protocol>,
    codec: Codec,
) -> Arc<dyn Endpoint> {
    let current = || {
        CurrentEndpoint::new(
            name,
            CurrentCommand::new(name, program, args.clone(), codec),
        )
    };
    let seed = || StdioEndpoint::new(name, program, args.clone());
    match protocol {
        Some(Protocol::Current) => Arc::new(current()),
        Some(Protocol::Transactions) => Arc::new(seed()),
        None => {
            let (detected, program, args) = (name.to_string(), program.to_string(), args.clone());
            Arc::new(Detecting::new(
                name,
                Arc::new(current()),
                Arc::new(seed()),
                Box::new(move || {
                    let (name, program, args) = (detected.clone(), program.clone(), args.clone());
                    async move { detect(&name, &program, &args, codec).await }.boxed()
                }),
            ))
        }
    }
}

/// The driver side: serves one current-protocol stream of `driver` on this process's
/// stdin and stdout, in `codec` ([`serve_current`]). Returns when the call is answered
/// (Spec, Validate, Apply) or the runtime closes stdin (a Transactions session). A
/// failure has been written to stderr as its error line when it returns; the process
/// should then exit non-zero.
pub async fn serve_current_stdio(driver: Arc<dyn Driver>, codec: Codec) -> Result<()> {
    let stdin = BufReader::new(tokio::io::stdin());
    let requests = futures::stream::unfold(Some(stdin), move |stdin| async move {
        let mut stdin = stdin?;
        match codec.read(&mut stdin, json::decode_request).await {
            Ok(Some(request)) => Some((Ok(request), Some(stdin))),
            Ok(None) => None,
            Err(err) => Some((Err(runtime_frame_error(err)), None)),
        }
    })
    .boxed();
    let (responses, responses_rx) = mpsc::channel(STREAM_BUFFER);
    let writer = tokio::spawn(write_responses(responses_rx, move |response| {
        codec.encode(response, json::encode_response)
    }));
    let served = serve_current(driver, requests, responses).await;
    let written = writer
        .await
        .map_err(|err| Error::Transport(format!("stdout writer panicked: {err}")));
    let served = served.and(written.and_then(|written| written));
    if let Err(err) = &served {
        report_error(err).await;
    }
    served
}
