//! The tests' Kafka broker: tansu on [`LOCAL_BROKER`], started when nothing answers
//! there, the way `.ci/services` starts it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the tests' broker listens.
pub const LOCAL_BROKER: &str = "127.0.0.1:9092";

fn answers(address: &str) -> bool {
    TcpStream::connect(address).is_ok()
}

/// Starts tansu on [`LOCAL_BROKER`] unless something answers there: the ready build
/// in `../shared/tools/tansu` beside the project when present, else `tansu` on the
/// `PATH`, with its data under `$HOME/.cache/sluice-tansu/local`. It is left running,
/// like the other local services, for the tests that follow; `.ci/services` starts it
/// the same way.
pub fn ensure_local_broker() -> Result<(), String> {
    if answers(LOCAL_BROKER) {
        return Ok(());
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    let dir = Path::new(&home).join(".cache/sluice-tansu/local");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // One starter at a time: tests run in parallel processes.
    let lock = std::fs::File::create(dir.join("start.lock"))
        .and_then(|file| file.lock().map(|()| file))
        .map_err(|e| format!("cannot lock {}: {e}", dir.display()))?;
    if answers(LOCAL_BROKER) {
        return Ok(());
    }
    let log = std::fs::File::create(dir.join("tansu.log"))
        .map_err(|e| format!("cannot create the tansu log in {}: {e}", dir.display()))?;
    let binary = tansu_binary();
    let url = format!("tcp://{LOCAL_BROKER}");
    let mut command = Command::new(&binary);
    command
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "sqlite://tansu.db"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stderr(log.try_clone().map_err(|e| e.to_string())?)
        .stdout(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn().map_err(|e| {
        format!(
            "no broker answers on {LOCAL_BROKER}, and {} cannot start: {e} (run .ci/services)",
            binary.display()
        )
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(LOCAL_BROKER) {
        if Instant::now() > deadline {
            return Err(format!(
                "tansu did not answer on {LOCAL_BROKER} within 30 s; see {}",
                dir.join("tansu.log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(lock);
    Ok(())
}

/// `../shared/tools/tansu` beside the project root when it exists, else `tansu`.
fn tansu_binary() -> PathBuf {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/tansu");
    if shared.exists() {
        shared
    } else {
        PathBuf::from("tansu")
    }
}
