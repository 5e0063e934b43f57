//! What every private server a test starts needs: a free local port, and the wait
//! until the server listens on it (its log in the message when it never does).
//!
//! A port free now is free only until someone binds it, and the tests run side by side
//! in many processes. Two of them handed the same port before either server listened
//! would share one server, and the first to stop it would cut the other's connections
//! (seen in CI: "Connection to the server is closed" from a private MariaDB that
//! another test had just dropped). So each port handed out is claimed by a lock on a
//! file named after it, held until the claiming process exits. The ports come from
//! below the ephemeral range (32768 and up on Linux), where the kernel does not pick a
//! connection's source port, each process starting its search at a place of its own.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a private server may take to listen.
const STARTUP: Duration = Duration::from_secs(20);

/// The ports handed out: below the ephemeral range, above the well-known services'.
const PORTS: std::ops::Range<u16> = 20_000..32_768;

/// The claims this process holds: each file's lock lasts as long as the file is open.
static CLAIMS: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A port on 127.0.0.1 nobody listens on now, and that no other process using this
/// function (nor this one again) is handed while this process lives.
pub fn free_port() -> u16 {
    let folder = claims_folder();
    let span = PORTS.end - PORTS.start;
    let first = (std::process::id() % u32::from(span / 10)) as u16 * 10;
    (0..span)
        .map(|i| PORTS.start + (first + i) % span)
        .find(|&port| {
            let path = folder.join(port.to_string());
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("claiming port {port} at {}: {e}", path.display()));
            // A lock held elsewhere (or here, for a server started earlier): someone
            // is about to listen on the port, or does.
            let claimed =
                file.try_lock().is_ok() && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
            if claimed {
                CLAIMS.lock().unwrap_or_else(|e| e.into_inner()).push(file);
            }
            claimed
        })
        .unwrap_or_else(|| {
            panic!(
                "no unclaimed local port in {PORTS:?} (claims in {})",
                folder.display()
            )
        })
}

/// Where the ports' claim files are: one folder for every process of this machine.
fn claims_folder() -> PathBuf {
    let folder = std::env::temp_dir().join("sluice-test-ports");
    std::fs::create_dir_all(&folder)
        .unwrap_or_else(|e| panic!("creating {}: {e}", folder.display()));
    folder
}

/// Returns once something listens on 127.0.0.1:`port`; panics naming `what` and
/// showing `log()` when nothing does within 20 seconds.
pub fn wait_for_port(port: u16, what: &str, log: impl Fn() -> String) {
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < STARTUP,
            "{what} did not start: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
