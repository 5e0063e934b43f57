//! A connector process, whatever its protocol: started in a process group of its own
//! with a parent-death signal, its stdout read line by line within the source's
//! timeout, its stderr logged under the source's name, and the whole group killed when
//! it is dropped.
//!
//! ```text
//!  spawn ─▶ setpgid(0, 0) + prctl(PR_SET_PDEATHSIG, SIGKILL) ─▶ exec connector
//!   stdout ─▶ next_line (each wait bounded by `timeout`: a hang is SourceError::Timeout)
//!   stderr ─▶ task: logged per line under source = name (errors warn); the last kept
//!   finish ─▶ exit 0: Ok │ else a retryable error carrying the connector's last error
//!   drop   ─▶ killpg(SIGKILL): the connector and everything it started
//! ```
//!
//! Why both the group and the signal: dropping the source (a disconnect, a seek, a
//! reopened loop) kills the group, children of the connector included (Python
//! connectors fork workers); a SIGKILL of Sluice runs no drop, and then the kernel
//! sends the connector SIGKILL as its parent dies. The parent-death signal follows the
//! *thread* that forked: connectors are spawned from the runtime's async workers, which
//! live as long as the runtime, never from the blocking pool, whose idle threads exit.
//!
//! A connector that exits non-zero is retried by the runtime like a lost connection
//! (`SourceError::Io` of kind `Other`): the error carries what it last said was wrong
//! (an error `LOG` or `TRACE` message, else its last stderr line).

use sluice_source_sdk::SourceError;
use std::ffi::OsString;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// The connector's stdout read ahead: 1 MiB holds many messages, so lines already
/// buffered are handed out without a system call.
const STDOUT_BUFFER: usize = 1 << 20;

/// A running connector.
pub struct Process {
    name: String,
    /// The command line, for messages.
    command: String,
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// The connector's process group (its pid).
    group: Option<i32>,
    timeout: Duration,
    /// What the connector last said was wrong (an error message, else a stderr line).
    said: Arc<Mutex<Said>>,
    stderr: tokio::task::JoinHandle<()>,
    /// The files handed to it (config, catalog, state); removed after it.
    _files: Option<TempDir>,
}

impl Process {
    /// Starts `program` + `args` for source `name`, its files in `files`.
    pub fn spawn(
        name: &str,
        program: &[String],
        args: Vec<OsString>,
        files: Option<TempDir>,
        timeout: Duration,
    ) -> Result<Process, SourceError> {
        let (first, rest) = program.split_first().expect("a command has a program");
        let mut command = Command::new(first);
        command
            .args(rest)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        die_with_parent(&mut command);
        let line = program
            .iter()
            .map(String::as_str)
            .chain(args.iter().filter_map(|a| a.to_str()))
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = command.spawn().map_err(|error| SourceError::Io {
            name: name.to_string(),
            path: line.clone(),
            error: if error.kind() == std::io::ErrorKind::NotFound {
                std::io::Error::new(
                    error.kind(),
                    format!(
                        "{error}: the connector is not installed or not on PATH (install \
                         it, e.g. `pip install airbyte-source-<name>` or `pip install \
                         tap-<name>`, or give its `command`)"
                    ),
                )
            } else {
                error
            },
        })?;
        let group = child.id().map(|pid| pid as i32);
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let said = Arc::new(Mutex::new(Said::default()));
        let stderr = tokio::spawn(log_stderr(name.to_string(), stderr, said.clone()));
        Ok(Process {
            name: name.to_string(),
            command: line,
            child,
            stdout: BufReader::with_capacity(STDOUT_BUFFER, stdout),
            group,
            timeout,
            said,
            stderr,
            _files: files,
        })
    }

    /// Reads the next line of stdout into `line` (cleared first, without its `\n`);
    /// `false` at its end. Fails with [`SourceError::Timeout`] when the connector says
    /// nothing for the timeout.
    pub async fn next_line(&mut self, line: &mut Vec<u8>) -> Result<bool, SourceError> {
        line.clear();
        let read = tokio::time::timeout(self.timeout, self.stdout.read_until(b'\n', line)).await;
        match read {
            Err(_) => Err(SourceError::Timeout {
                name: self.name.clone(),
                call: "the connector's next message",
                after: self.timeout,
            }),
            Ok(Err(error)) => Err(self.io_error(error)),
            Ok(Ok(0)) => Ok(false),
            Ok(Ok(_)) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                Ok(true)
            }
        }
    }

    /// Whether a whole line is already buffered (reading it waits for nothing).
    pub fn line_buffered(&self) -> bool {
        self.stdout.buffer().contains(&b'\n')
    }

    /// Reads the rest of stdout whole (a Singer tap's pretty-printed catalog).
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, SourceError> {
        let mut all = Vec::new();
        match tokio::time::timeout(self.timeout, self.stdout.read_to_end(&mut all)).await {
            Err(_) => Err(SourceError::Timeout {
                name: self.name.clone(),
                call: "the connector's output",
                after: self.timeout,
            }),
            Ok(Err(error)) => Err(self.io_error(error)),
            Ok(Ok(_)) => Ok(all),
        }
    }

    /// Remembers what the connector said was wrong (an error message on stdout), for
    /// the error of a non-zero exit.
    pub fn said_error(&self, message: &str) {
        self.said.lock().expect("what the connector said").reported = Some(message.to_string());
    }

    /// What the connector last said was wrong, if anything.
    pub fn last_error(&self) -> Option<String> {
        self.said.lock().expect("what the connector said").best()
    }

    /// Waits for the connector to exit (its stdout ended): `Ok` for status 0, else the
    /// retryable error of a connector that failed, naming its last error.
    pub async fn finish(mut self) -> Result<(), SourceError> {
        let status = tokio::time::timeout(self.timeout, self.child.wait()).await;
        // Its stderr ends with it: every line is logged and the last error known.
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.stderr).await;
        match status {
            Err(_) => Err(SourceError::Timeout {
                name: self.name.clone(),
                call: "the connector's exit",
                after: self.timeout,
            }),
            Ok(Err(error)) => Err(self.io_error(error)),
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => {
                let said = self
                    .last_error()
                    .unwrap_or_else(|| "it said nothing on stderr".to_string());
                Err(self.io_error(std::io::Error::other(format!(
                    "the connector exited with {status}: {said}"
                ))))
            }
        }
    }

    fn io_error(&self, error: std::io::Error) -> SourceError {
        SourceError::Io {
            name: self.name.clone(),
            path: self.command.clone(),
            error,
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stderr.abort();
        if let Some(group) = self.group {
            kill_group(group);
        }
    }
}

/// What a connector said was wrong, best first: an error message of its protocol, an
/// error line on stderr, its last stderr line.
#[derive(Debug, Default)]
struct Said {
    reported: Option<String>,
    stderr_error: Option<String>,
    stderr_last: Option<String>,
}

impl Said {
    fn best(&self) -> Option<String> {
        self.reported
            .clone()
            .or_else(|| self.stderr_error.clone())
            .or_else(|| self.stderr_last.clone())
    }
}

/// Logs each stderr line under the source's name, keeping the last error line and the
/// last line for the error of a non-zero exit.
async fn log_stderr(name: String, stderr: tokio::process::ChildStderr, said: Arc<Mutex<Said>>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        // Connectors log freely on stderr (Singer taps their metrics every few
        // seconds): only what reads as an error is a warning.
        let mut said = said.lock().expect("what the connector said");
        if line.to_ascii_lowercase().contains("error") {
            tracing::warn!(source = %name, "connector: {line}");
            said.stderr_error = Some(line.to_string());
        } else {
            tracing::debug!(source = %name, "connector: {line}");
        }
        said.stderr_last = Some(line.to_string());
    }
}

/// SIGKILL to every process of the group `group`.
#[allow(unsafe_code)]
fn kill_group(group: i32) {
    // SAFETY: killpg has no memory effects; an already-gone group is ESRCH, ignored.
    unsafe {
        libc::killpg(group, libc::SIGKILL);
    }
}

/// The connector gets SIGKILL when the thread that started it dies (Sluice killed).
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    // SAFETY: between fork and exec only prctl and getppid run, both async-signal-safe,
    // and nothing is allocated. If the parent died before prctl took effect, the
    // parent is init's: exit at once rather than outlive it.
    unsafe {
        let parent = libc::getpid();
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
