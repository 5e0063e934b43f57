//! The tests' S3-compatible server: moto's (`python3 -m moto.server`) on [`LOCAL_S3`],
//! started when nothing answers there, the way `.ci/services` starts it; and
//! [`TestBucket`], a bucket of a test's own, created and removed with it.
//!
//! moto keeps objects in memory, checks no signature (any key pair is accepted), and
//! honours `If-None-Match: *` on PUT and on multipart completion, which is what the
//! writers' conditional puts need. Buckets are made and removed by plain HTTP requests
//! (no client here makes buckets); objects go through `sluice-object-store`.

use sluice_object_store::{S3Settings, S3Store};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where the tests' S3 server listens.
pub const LOCAL_S3: &str = "127.0.0.1:9000";
/// The key pair the tests sign with (moto accepts any).
pub const ACCESS_KEY_ID: &str = "sluice-test";
pub const SECRET_ACCESS_KEY: &str = "sluice-test-secret";
pub const REGION: &str = "us-east-1";

fn answers() -> bool {
    TcpStream::connect(LOCAL_S3).is_ok()
}

/// Starts moto's server on [`LOCAL_S3`] unless something answers there, its log under
/// `$HOME/.cache/sluice-moto`. It is left running, like the other local services, for
/// the tests that follow.
pub fn ensure_local_s3() -> Result<(), String> {
    if answers() {
        return Ok(());
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    let dir = Path::new(&home).join(".cache/sluice-moto");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // One starter at a time: tests run in parallel processes.
    let lock = std::fs::File::create(dir.join("start.lock"))
        .and_then(|file| file.lock().map(|()| file))
        .map_err(|e| format!("cannot lock {}: {e}", dir.display()))?;
    if answers() {
        return Ok(());
    }
    let log = std::fs::File::create(dir.join("moto.log"))
        .map_err(|e| format!("cannot create the moto log in {}: {e}", dir.display()))?;
    let (host, port) = LOCAL_S3.split_once(':').expect("host:port");
    let mut command = Command::new("python3");
    command
        .args(["-m", "moto.server", "-H", host, "-p", port])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stderr(log.try_clone().map_err(|e| e.to_string())?)
        .stdout(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn().map_err(|e| {
        format!("no S3 server answers on {LOCAL_S3}, and moto cannot start: {e} (run .ci/services)")
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers() {
        if Instant::now() > deadline {
            return Err(format!(
                "moto did not answer on {LOCAL_S3} within 30 s (is `moto[server]` installed? \
                 .ci/services installs it); see {}",
                dir.join("moto.log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(lock);
    Ok(())
}

/// The settings that reach [`LOCAL_S3`].
pub fn settings() -> S3Settings {
    S3Settings {
        endpoint: Some(format!("http://{LOCAL_S3}")),
        region: Some(REGION.into()),
        access_key_id: Some(ACCESS_KEY_ID.into()),
        secret_access_key: Some(SECRET_ACCESS_KEY.into()),
        path_style: true,
    }
}

/// A bucket of one test's own on [`LOCAL_S3`]: created by [`TestBucket::create`], and
/// emptied and removed when dropped.
pub struct TestBucket {
    pub name: String,
}

impl TestBucket {
    /// A new empty bucket named after `test` (starting the server if none answers).
    pub fn create(test: &str) -> TestBucket {
        static N: AtomicU32 = AtomicU32::new(0);
        ensure_local_s3().unwrap_or_else(|e| panic!("{e}"));
        let stem: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(36)
            .collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!(
            "t-{}-{:x}-{}-{:x}",
            stem.trim_matches('-'),
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            nanos
        );
        let status = request("PUT", &format!("/{name}"));
        assert!(
            status == 200,
            "creating bucket {name} on {LOCAL_S3}: HTTP {status}"
        );
        TestBucket { name }
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.name)
    }

    /// The bucket's client, to look at what a test wrote.
    pub fn store(&self) -> S3Store {
        S3Store::connect(&self.name, &settings()).expect("the test settings are valid")
    }
}

impl Drop for TestBucket {
    fn drop(&mut self) {
        // On a thread of its own: a test's runtime may be the one dropping this.
        let store = self.store();
        let emptied = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(store.delete_prefix(""))
                .map_err(|e| e.to_string())
        })
        .join();
        match emptied {
            Ok(Ok(_)) => {
                request("DELETE", &format!("/{}", self.name));
            }
            other => eprintln!("cannot empty test bucket {}: {other:?}", self.name),
        }
    }
}

/// Sends `method path` with no body to [`LOCAL_S3`]; the response's status.
fn request(method: &str, path: &str) -> u16 {
    let send = || -> std::io::Result<u16> {
        let mut stream = TcpStream::connect(LOCAL_S3)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {LOCAL_S3}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    };
    send().unwrap_or_else(|e| panic!("{method} {path} on {LOCAL_S3}: {e}"))
}
