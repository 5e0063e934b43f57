//! The tests' Kafka broker: tansu on [`LOCAL_BROKER`], started when nothing answers
//! there, the way `.ci/services` starts it; and [`SecuredTansu`], a private one
//! requiring TLS and SASL.

use crate::conformance::tls::TestCertificates;
use crate::ports::free_port;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the tests' broker listens.
pub const LOCAL_BROKER: &str = "127.0.0.1:9092";

fn answers(address: &str) -> bool {
    TcpStream::connect(address).is_ok()
}

/// Starts tansu on [`LOCAL_BROKER`] unless something answers there ([`tansu_binary`]),
/// with its data under `$HOME/.cache/sluice-tansu/local`. It is left running,
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

/// The tansu to run: the ready build in `../shared/tools/tansu` beside the project
/// root, or beside the machine's main checkout (`/work/shared/tools/tansu`, for a clone
/// elsewhere, as `.ci/services` looks), when one exists, else `tansu` on the `PATH`.
pub fn tansu_binary() -> PathBuf {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/tansu");
    [beside, PathBuf::from("/work/shared/tools/tansu")]
        .into_iter()
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("tansu"))
}

/// The user [`SecuredTansu`] knows, with [`PASSWORD`] (SCRAM-SHA-256 and -512).
pub const USER: &str = "sluice";
pub const PASSWORD: &str = "s3cret-of-the-kafka-user";

/// A private tansu requiring SASL, behind a TLS-terminating proxy, for the Kafka
/// source's and output's TLS and SASL tests. tansu 0.6.0 cannot serve TLS itself
/// (`--cert` and `--key` cannot be given together), so the proxy (tokio-rustls)
/// presents the server certificate and forwards to tansu in plain text; tansu
/// advertises the proxy, so clients reach every broker through it. Its data is in a
/// folder of its own; the broker is killed and the proxy stopped when dropped.
///
/// ```text
///  client ──TLS──▶ proxy localhost:<port> ──TCP──▶ tansu 127.0.0.1:<port> --authentication
/// ```
pub struct SecuredTansu {
    dir: tempfile::TempDir,
    broker: Child,
    proxy_port: u16,
    proxying: tokio::task::JoinHandle<()>,
}

impl SecuredTansu {
    /// Starts tansu with [`USER`] (created by a first start without authentication, as
    /// creating a user needs no login then), and the proxy presenting `certificates`'
    /// server certificate.
    pub async fn start(certificates: &TestCertificates) -> SecuredTansu {
        let server = sluice_tls::ServerTls {
            certificate: certificates.file("server.crt").into(),
            key: certificates.file("server.key").into(),
            client_ca: None,
        };
        let tls = server
            .acceptor("tls")
            .expect("the test server's certificate");
        let dir = tempfile::tempdir().expect("a temporary folder");
        let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        let proxy_port = proxy.local_addr().expect("its address").port();
        let broker_port = free_port();
        let plain = format!("tcp://localhost:{broker_port}");
        let mut setup = start_broker(dir.path(), broker_port, &plain, false);
        for mechanism in ["scram256", "scram512"] {
            let created = Command::new(tansu_binary())
                .args([
                    "user",
                    "create",
                    "--broker",
                    &plain,
                    "--mechanism",
                    mechanism,
                ])
                .args([USER, PASSWORD])
                .output()
                .expect("running tansu user create");
            assert!(created.status.success(), "tansu user create: {created:?}");
        }
        setup.kill().expect("stopping the set-up broker");
        setup.wait().expect("its exit");
        let advertised = format!("tcp://localhost:{proxy_port}");
        let broker = start_broker(dir.path(), broker_port, &advertised, true);
        proxy
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let proxy = tokio::net::TcpListener::from_std(proxy).expect("the proxy listener");
        let proxying = tokio::spawn(terminate_tls(proxy, tls, broker_port));
        SecuredTansu {
            dir,
            broker,
            proxy_port,
            proxying,
        }
    }

    /// `localhost:<port>`: the name the test server certificate holds.
    pub fn address(&self) -> String {
        format!("localhost:{}", self.proxy_port)
    }

    /// What the broker logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }
}

impl Drop for SecuredTansu {
    fn drop(&mut self) {
        self.proxying.abort();
        let _ = self.broker.kill();
        let _ = self.broker.wait();
    }
}

/// tansu on 127.0.0.1:`port` advertising `advertised`, its data and log in `dir`,
/// answering TCP.
fn start_broker(dir: &Path, port: u16, advertised: &str, authentication: bool) -> Child {
    let log = std::fs::File::create(dir.join("tansu.log")).expect("the tansu log");
    let mut command = Command::new(tansu_binary());
    command
        .args([
            "broker",
            "--listener-url",
            &format!("tcp://127.0.0.1:{port}"),
        ])
        .args(["--advertised-listener-url", advertised])
        .args(["--storage-engine", "sqlite://tansu.db"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log"))
        .stderr(log);
    if authentication {
        command.arg("--authentication");
    }
    let child = command.spawn().expect("starting tansu");
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(&address) {
        assert!(
            Instant::now() < deadline,
            "tansu did not answer on {address}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Accepts TLS on `listener` and forwards each connection's plain bytes to
/// 127.0.0.1:`port`; a failed handshake drops that connection (rustls has sent its
/// alert).
async fn terminate_tls(listener: tokio::net::TcpListener, tls: sluice_tls::TlsAcceptor, port: u16) {
    while let Ok((client, _)) = listener.accept().await {
        let tls = tls.clone();
        tokio::spawn(async move {
            let Ok(mut client) = tls.accept(client).await else {
                return;
            };
            let Ok(mut broker) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
        });
    }
}
