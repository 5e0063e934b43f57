//! TLS against a private PostgreSQL cluster that accepts TLS connections only
//! (`hostssl` alone in pg_hba.conf), with the certificates of
//! [`sluice_testkit::conformance::tls`] (the server's names `localhost` only): `verify-full` with the CA
//! connects to `localhost` and passes the conformance suite; plain connections are
//! refused; a wrong CA, or a host the certificate does not name, fails `verify-full`
//! naming the certificate problem (the issuer, for a wrong CA, in every verifying mode); `verify-ca` and `require` connect where libpq's do.
//!
//! The cluster runs `initdb` + `pg_ctl` from `/usr/lib/postgresql/*/bin` on a spare
//! port, as `postgres` when the test runs as root (PostgreSQL refuses to run as root).

use serde_json::json;
use sluice_conformance::{Capabilities, assert_all_pass, run_suite};
use sluice_driver_sdk::Error;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_pg_client::EndpointConfig;
use sluice_postgres::PostgresDriver;
use sluice_testkit::conformance::tls::TestCertificates;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Runs `program` with `args` (as `postgres` when `as_postgres` and we are root) and
/// panics with its output if it fails.
fn run(program: &Path, args: &[&str], as_postgres: bool) {
    let mut command = if as_postgres && is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    let out = command
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("running {}: {err}", program.display()));
    assert!(
        out.status.success(),
        "{} {}: {}\n{}{}",
        program.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// A private cluster accepting TLS only, stopped (immediately) when dropped.
struct TlsCluster {
    _dir: tempfile::TempDir,
    root: PathBuf,
    certificates: TestCertificates,
    bin: PathBuf,
    port: u16,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL binaries in /usr/lib/postgresql")
            .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .expect("a /usr/lib/postgresql/*/bin/initdb");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let certificates = TestCertificates::make(&root);
        if is_root() {
            run(
                Path::new("chown"),
                &["-R", "postgres:postgres", &path(&root)],
                false,
            );
        }
        let data = path(&root.join("data"));
        run(
            &bin.join("initdb"),
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
            true,
        );
        let hba = "local all all trust\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostssl all all ::1/128 trust\n";
        std::fs::write(root.join("data/pg_hba.conf"), hba).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let options = format!(
            "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c ssl=on \
             -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key",
            dir = path(&root)
        );
        let log = path(&root.join("server.log"));
        let cluster = TlsCluster {
            _dir: dir,
            root,
            certificates,
            bin,
            port,
        };
        run(
            &cluster.bin.join("pg_ctl"),
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
            true,
        );
        cluster
    }

    /// The endpoint of `host` with the URL options `query`.
    fn endpoint(&self, host: &str, query: &str) -> serde_json::Value {
        let url = format!("postgres://postgres@{host}:{}/postgres?{query}", self.port);
        json!({ "url": url, "schema": "tls" })
    }

    /// The path of a file the test made, as a URL option value.
    fn file(&self, name: &str) -> String {
        self.certificates.file(name)
    }

    /// Connects as the driver does (`sluice_pg_client::connect`), as `endpoint` says.
    async fn connect(&self, endpoint: &serde_json::Value) -> Result<(), Error> {
        let config = EndpointConfig::parse(&endpoint.to_string())?;
        let client = sluice_pg_client::connect(&config).await?;
        client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(|err| sluice_pg_client::pg_error("SELECT 1", err))
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let data = path(&self.root.join("data"));
        run(
            &self.bin.join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "-w", "stop"],
            true,
        );
    }
}

fn path(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The message of a store error that retrying cannot fix.
fn permanent(result: Result<(), Error>) -> String {
    match result {
        Err(Error::Store {
            context,
            message,
            retryable: false,
        }) => format!("{context}: {message}"),
        other => panic!("expected a store error that is not retryable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_full_with_the_ca_passes_the_conformance_suite_and_plain_is_refused() {
    let cluster = TlsCluster::start();
    let ca = format!("sslmode=verify-full&sslrootcert={}", cluster.file("ca.crt"));
    let endpoint = cluster.endpoint("localhost", &ca);

    let driver = InProcess::new("postgres", Arc::new(PostgresDriver::new()));
    let results = run_suite(
        &driver,
        Capabilities::ALL,
        endpoint,
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass(&results);

    let plain = permanent(
        cluster
            .connect(&cluster.endpoint("127.0.0.1", "sslmode=disable"))
            .await,
    );
    assert!(plain.contains("no pg_hba.conf entry"), "{plain}");
    assert!(plain.contains("no encryption"), "{plain}");
}

#[tokio::test(flavor = "multi_thread")]
async fn certificates_are_checked_as_libpq_checks_them() {
    let cluster = TlsCluster::start();
    let (ca, other_ca) = (cluster.file("ca.crt"), cluster.file("other-ca.crt"));

    // A CA that did not sign the server's certificate.
    let wrong_ca = format!("sslmode=verify-full&sslrootcert={other_ca}");
    let err = permanent(
        cluster
            .connect(&cluster.endpoint("localhost", &wrong_ca))
            .await,
    );
    let named = format!(
        "sslmode=verify-full sslrootcert={other_ca}: the server's certificate does not \
         verify: issued by CN=Sluice test ca, not by a CA of sslrootcert ({other_ca})"
    );
    assert!(err.contains(&named), "{err}");

    // The right CA, but a host the certificate does not name.
    let right_ca = format!("sslmode=verify-full&sslrootcert={ca}");
    let err = permanent(
        cluster
            .connect(&cluster.endpoint("127.0.0.1", &right_ca))
            .await,
    );
    assert!(
        err.contains("the server's certificate does not verify: certificate not valid for name"),
        "{err}"
    );

    // verify-ca checks the chain only, and names the issuer of a certificate another CA
    // signed; require without a CA checks nothing, and with
    // one it checks the chain (as libpq).
    let issued_by_ca = format!(
        "does not verify: issued by CN=Sluice test ca, not by a CA of sslrootcert ({other_ca})"
    );
    let chain_only = format!("sslmode=verify-ca&sslrootcert={ca}");
    cluster
        .connect(&cluster.endpoint("127.0.0.1", &chain_only))
        .await
        .unwrap();
    let err = permanent(
        cluster
            .connect(&cluster.endpoint(
                "127.0.0.1",
                &format!("sslmode=verify-ca&sslrootcert={other_ca}"),
            ))
            .await,
    );
    assert!(err.contains(&issued_by_ca), "{err}");
    cluster
        .connect(&cluster.endpoint("127.0.0.1", "sslmode=require"))
        .await
        .unwrap();
    let err = permanent(
        cluster
            .connect(&cluster.endpoint(
                "127.0.0.1",
                &format!("sslmode=require&sslrootcert={other_ca}"),
            ))
            .await,
    );
    assert!(err.contains(&issued_by_ca), "{err}");

    // The weak modes connect too: prefer over TLS, allow after the plain refusal.
    for weak in ["sslmode=prefer", "sslmode=allow", ""] {
        cluster
            .connect(&cluster.endpoint("127.0.0.1", weak))
            .await
            .unwrap();
    }

    // An unreadable CA file is a configuration error naming the option.
    let missing = format!(
        "sslmode=verify-full&sslrootcert={}",
        cluster.file("missing.crt")
    );
    let err = cluster
        .connect(&cluster.endpoint("localhost", &missing))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("sslrootcert="), "{err}");
    assert!(err.to_string().contains("cannot read the CA file"), "{err}");
}
