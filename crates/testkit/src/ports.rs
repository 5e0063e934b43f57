//! What every private server a test starts needs: a free local port, and the wait
//! until the server listens on it (its log in the message when it never does).

use std::time::{Duration, Instant};

/// How long a private server may take to listen.
const STARTUP: Duration = Duration::from_secs(20);

/// A port on 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port")
        .port()
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
