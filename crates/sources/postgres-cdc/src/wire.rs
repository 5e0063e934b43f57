//! The replication connection: PostgreSQL's frontend/backend protocol over TCP with
//! `replication=database`, which tokio-postgres cannot open (it has no CopyBoth mode).
//! Message encoding and SCRAM/MD5 come from `postgres-protocol`; the framing of what
//! the server sends, and the few messages a walsender sends, are read here.
//!
//! TLS as the URL's `sslmode` says ([`sluice_source_sdk::tls::libpq`], as the SQL
//! connection and the store read it): an SSLRequest first, then the server's one byte,
//! `S` (a rustls handshake checking the URL's host) or `N` (plain text, refused unless
//! the mode allows it); `allow` tries plain text first and TLS if the server refuses.
//! SCRAM has no channel binding (gs2 flag `n`), which a server accepts over TLS too.
//!
//! ```text
//!  connect (SSLRequest?, TLS?, startup, auth) ─▶ query("CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT")   (rows as text)
//!                          ─▶ start("START_REPLICATION SLOT s LOGICAL L (…)") ─▶ CopyBoth
//!                                 ├─ Reader: XLogData ('w') and keepalives ('k')
//!                                 └─ Writer: standby status updates ('r')
//! ```
//!
//! Session settings fix the text form of every value (ISO dates, UTC, shortest exact
//! floats, hex bytea): the walsender formats pgoutput's tuples with them, and the
//! snapshot connection sets the same ([`SESSION`]), so a row reads the same either way.

use bytes::{Buf, BufMut, BytesMut};
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::frontend;
use sluice_source_sdk::tls::libpq::{Attempt, SslOptions};
use sluice_source_sdk::tls::rustls::ClientConfig;
use sluice_source_sdk::tls::{TlsConnector, handshake_failure};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The halves of a connection, plain or TLS.
type ReadHalf = Box<dyn AsyncRead + Send + Sync + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Sync + Unpin>;

/// The SSLRequest: its length and the code 1234/5679.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The settings under which values are formatted as text, on every connection.
pub const SESSION: [(&str, &str); 5] = [
    ("DateStyle", "ISO"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("IntervalStyle", "postgres"),
];

/// How long connecting and authenticating may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where and as whom to connect (from the source's URL).
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<Vec<u8>>,
    pub database: String,
    /// `sslmode` and `sslrootcert`.
    pub ssl: SslOptions,
    /// The URL without them, as tokio-postgres reads it (the SQL connection).
    pub url: String,
}

/// A failure of the replication connection: the server's error (with its SQLSTATE),
/// TLS that cannot be had or does not verify (retrying does not change it), or I/O.
#[derive(Debug)]
pub enum WireError {
    Server { code: String, message: String },
    Tls(String),
    Io(io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Server { code, message } => write!(f, "{message} (SQLSTATE {code})"),
            WireError::Tls(why) => f.write_str(why),
            WireError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Io(e)
    }
}

fn protocol(what: impl Into<String>) -> WireError {
    WireError::Io(io::Error::new(io::ErrorKind::InvalidData, what.into()))
}

/// One backend message: its tag and body.
pub struct Message {
    pub tag: u8,
    pub body: BytesMut,
}

/// Reads whole backend messages from a byte stream; cancel-safe (bytes read are kept in
/// the buffer).
pub struct Framed<R> {
    read: R,
    buf: BytesMut,
}

impl<R: tokio::io::AsyncRead + Unpin> Framed<R> {
    fn new(read: R) -> Self {
        Framed {
            read,
            buf: BytesMut::with_capacity(64 * 1024),
        }
    }

    pub async fn next(&mut self) -> Result<Message, WireError> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().expect("4 bytes")) as usize;
                if len < 4 {
                    return Err(protocol(format!("a message of length {len}")));
                }
                if self.buf.len() > len {
                    let mut frame = self.buf.split_to(len + 1);
                    let tag = frame[0];
                    frame.advance(5);
                    if tag == b'E' {
                        return Err(server_error(&frame));
                    }
                    return Ok(Message { tag, body: frame });
                }
                self.buf.reserve(len + 1 - self.buf.len());
            }
            if self.read.read_buf(&mut self.buf).await? == 0 {
                return Err(WireError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the replication connection",
                )));
            }
        }
    }
}

/// The fields of an ErrorResponse: `S`everity, `C`ode, `M`essage, `D`etail, `H`int.
fn server_error(body: &[u8]) -> WireError {
    let (mut code, mut message, mut extra) = (String::new(), String::new(), String::new());
    for field in body.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let text = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'C' => code = text,
            b'M' => message = text,
            b'D' | b'H' => extra = format!("{extra}; {text}"),
            _ => {}
        }
    }
    WireError::Server {
        code,
        message: format!("{message}{extra}"),
    }
}

/// A replication connection before streaming: simple queries only.
pub struct Connection {
    framed: Framed<ReadHalf>,
    write: WriteHalf,
}

impl Connection {
    /// Connects (over TLS as `target.ssl` says, checked by `tls`), authenticates
    /// (trust, password, MD5 or SCRAM-SHA-256) and waits for the server to be ready.
    pub async fn connect(
        target: &Target,
        tls: &Arc<ClientConfig>,
    ) -> Result<Connection, WireError> {
        let (first, if_refused) = target.ssl.mode.attempts();
        let attempts = async {
            match (Self::connect_now(target, tls, first).await, if_refused) {
                // `allow`: the server refused the plain attempt, perhaps for want of TLS.
                (Err(WireError::Server { .. }), Some(retry)) => {
                    Self::connect_now(target, tls, retry).await
                }
                (connected, _) => connected,
            }
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, attempts).await {
            Ok(connected) => connected,
            Err(_) => Err(WireError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting took over {}s", CONNECT_TIMEOUT.as_secs()),
            ))),
        }
    }

    /// The TCP connection, over TLS unless `attempt` is plain or the server declines
    /// it where `attempt` allows that.
    async fn open(
        target: &Target,
        tls: &Arc<ClientConfig>,
        attempt: Attempt,
    ) -> Result<(ReadHalf, WriteHalf), WireError> {
        let mut stream = TcpStream::connect((target.host.as_str(), target.port)).await?;
        stream.set_nodelay(true)?;
        let plain = |stream: TcpStream| {
            let (read, write) = stream.into_split();
            Ok((Box::new(read) as ReadHalf, Box::new(write) as WriteHalf))
        };
        if attempt == Attempt::Plain {
            return plain(stream);
        }
        stream.write_all(&SSL_REQUEST).await?;
        match (stream.read_u8().await?, attempt) {
            (b'S', _) => {}
            (b'N', Attempt::Prefer) => return plain(stream),
            (b'N', _) => {
                return Err(WireError::Tls(
                    "the server does not accept TLS (is ssl off?)".into(),
                ));
            }
            (other, _) => {
                return Err(protocol(format!(
                    "expected S or N in answer to the SSLRequest, got {other:?}"
                )));
            }
        }
        let name = sluice_source_sdk::tls::server_name(&target.host)
            .map_err(|e| WireError::Tls(e.message))?;
        let stream = (TlsConnector::from(tls.clone()).connect(name, stream).await)
            .map_err(|e| handshake_failure(&e).map_or(WireError::Io(e), WireError::Tls))?;
        let (read, write) = tokio::io::split(stream);
        Ok((Box::new(read) as ReadHalf, Box::new(write) as WriteHalf))
    }

    async fn connect_now(
        target: &Target,
        tls: &Arc<ClientConfig>,
        attempt: Attempt,
    ) -> Result<Connection, WireError> {
        let (read, write) = Self::open(target, tls, attempt).await?;
        let mut conn = Connection {
            framed: Framed::new(read),
            write,
        };
        let mut params = vec![
            ("user", target.user.as_str()),
            ("database", target.database.as_str()),
            ("replication", "database"),
            ("application_name", "sluice"),
        ];
        params.extend(SESSION);
        let mut buf = BytesMut::new();
        frontend::startup_message(params, &mut buf)?;
        conn.send(&buf).await?;
        conn.authenticate(target).await?;
        loop {
            let message = conn.framed.next().await?;
            if message.tag == b'Z' {
                return Ok(conn);
            }
        }
    }

    async fn authenticate(&mut self, target: &Target) -> Result<(), WireError> {
        let password = || {
            target.password.clone().ok_or_else(|| WireError::Server {
                code: "28P01".into(),
                message: format!(
                    "the server asks a password of user {} and the URL has none",
                    target.user
                ),
            })
        };
        let mut scram: Option<sasl::ScramSha256> = None;
        loop {
            let mut message = self.framed.next().await?;
            if message.tag != b'R' {
                return Err(protocol(format!(
                    "expected an authentication request, got message {:?}",
                    message.tag as char
                )));
            }
            let mut buf = BytesMut::new();
            match message.body.get_i32() {
                0 => return Ok(()),
                3 => frontend::password_message(&password()?, &mut buf)?,
                5 => {
                    let salt: [u8; 4] = message.body[..4].try_into().expect("4 bytes of salt");
                    let hash = md5_hash(target.user.as_bytes(), &password()?, salt);
                    frontend::password_message(hash.as_bytes(), &mut buf)?;
                }
                10 => {
                    let mechanisms = String::from_utf8_lossy(&message.body);
                    if !mechanisms.split('\0').any(|m| m == sasl::SCRAM_SHA_256) {
                        return Err(protocol(format!("no SASL mechanism we know: {mechanisms}")));
                    }
                    let s =
                        sasl::ScramSha256::new(&password()?, sasl::ChannelBinding::unsupported());
                    frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut buf)?;
                    scram = Some(s);
                }
                11 => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| protocol("SASL out of order"))?;
                    s.update(&message.body)?;
                    frontend::sasl_response(s.message(), &mut buf)?;
                }
                12 => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| protocol("SASL out of order"))?;
                    s.finish(&message.body)?;
                    continue;
                }
                other => {
                    return Err(protocol(format!(
                        "authentication method {other} is not supported (use trust, \
                         password, md5 or scram-sha-256)"
                    )));
                }
            }
            self.send(&buf).await?;
        }
    }

    async fn send(&mut self, buf: &[u8]) -> Result<(), WireError> {
        self.write.write_all(buf).await?;
        Ok(())
    }

    /// Runs a simple query (a replication command or SQL); returns its rows, each value
    /// as text (`None` for NULL).
    pub async fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, WireError> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.send(&buf).await?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            let message = match self.framed.next().await {
                Ok(message) => message,
                Err(e @ WireError::Server { .. }) => {
                    failed = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            match message.tag {
                b'D' => rows.push(data_row(message.body)?),
                b'Z' => return failed.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// Sends `START_REPLICATION …` and returns the two halves of the CopyBoth stream.
    pub async fn start(mut self, command: &str) -> Result<(Reader, Writer), WireError> {
        let mut buf = BytesMut::new();
        frontend::query(command, &mut buf)?;
        self.send(&buf).await?;
        loop {
            let message = self.framed.next().await?;
            if message.tag == b'W' {
                return Ok((
                    Reader {
                        framed: self.framed,
                    },
                    Writer { write: self.write },
                ));
            }
        }
    }
}

fn data_row(mut body: BytesMut) -> Result<Vec<Option<String>>, WireError> {
    let n = body.get_i16();
    (0..n)
        .map(|_| {
            let len = body.get_i32();
            if len < 0 {
                return Ok(None);
            }
            let value = body.split_to(len as usize);
            String::from_utf8(value.to_vec())
                .map(Some)
                .map_err(|e| protocol(e.to_string()))
        })
        .collect()
}

/// What the walsender sends while streaming.
pub enum Copy {
    /// XLogData: a pgoutput message.
    Data { body: BytesMut, wal_end: u64 },
    /// A keepalive: the server has sent everything up to `wal_end`; `reply` asks for a
    /// status update at once.
    Keepalive { wal_end: u64, reply: bool },
}

/// The receiving half of a replication stream.
pub struct Reader {
    framed: Framed<ReadHalf>,
}

impl Reader {
    /// The next XLogData or keepalive. Cancel-safe.
    pub async fn next(&mut self) -> Result<Copy, WireError> {
        loop {
            let mut message = self.framed.next().await?;
            match message.tag {
                b'd' if message.body.first() == Some(&b'w') => {
                    // The message's WAL start and end, and the send time.
                    message.body.advance(1 + 8);
                    let wal_end = message.body.get_u64();
                    message.body.advance(8);
                    return Ok(Copy::Data {
                        body: message.body,
                        wal_end,
                    });
                }
                b'd' if message.body.first() == Some(&b'k') => {
                    message.body.advance(1);
                    let wal_end = message.body.get_u64();
                    message.body.advance(8);
                    let reply = message.body.first() == Some(&1);
                    return Ok(Copy::Keepalive { wal_end, reply });
                }
                b'c' => {
                    return Err(protocol("the server ended the replication stream"));
                }
                _ => {} // notices, parameter changes
            }
        }
    }
}

/// The sending half of a replication stream.
pub struct Writer {
    write: WriteHalf,
}

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl Writer {
    /// A standby status update: everything up to `flushed` is durable here, so the
    /// slot may release it. `reply` asks the server for a keepalive at once.
    pub async fn status(&mut self, flushed: u64, reply: bool) -> Result<(), WireError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as i64
            - PG_EPOCH_MICROS;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(flushed); // written
        body.put_u64(flushed); // flushed
        body.put_u64(flushed); // applied
        body.put_i64(now);
        body.put_u8(u8::from(reply));
        let mut buf = BytesMut::new();
        frontend::CopyData::new(&body[..])?.write(&mut buf);
        self.write.write_all(&buf).await?;
        Ok(())
    }
}

/// An LSN in PostgreSQL's text form (`16/B374D848`).
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

/// An LSN as PostgreSQL writes it.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PostgresCdcConfig;
    use sluice_testkit::postgres::LogicalPostgres;

    /// Connects to `pg` (TLS only) at `host` with the URL options `query`.
    async fn connect(
        pg: &LogicalPostgres,
        host: &str,
        query: &str,
    ) -> Result<Connection, WireError> {
        let url = format!("postgres://postgres@{host}:{}/postgres?{query}", pg.port);
        let value = serde_json::json!({"url": url, "publication": "p"});
        let config: PostgresCdcConfig = sluice_source_sdk::config::parse(value).unwrap();
        let target = config.target().unwrap();
        let tls = Arc::new(target.ssl.client_config().unwrap());
        Connection::connect(&target, &tls).await
    }

    #[tokio::test]
    async fn the_replication_connection_takes_tls_as_sslmode_says() {
        let pg = LogicalPostgres::start_tls();
        let ca = pg.certificates.as_ref().unwrap().file("ca.crt");
        let other_ca = pg.certificates.as_ref().unwrap().file("other-ca.crt");
        let full = format!("sslmode=verify-full&sslrootcert={ca}");
        let mut conn = connect(&pg, "localhost", &full).await.unwrap();
        let rows = conn.query("IDENTIFY_SYSTEM").await.unwrap();
        assert_eq!(rows.len(), 1);
        // The weak modes find TLS: prefer at once, allow after the plain refusal.
        for weak in ["sslmode=prefer", "sslmode=allow", "sslmode=require"] {
            connect(&pg, "127.0.0.1", weak).await.unwrap();
        }

        let wrong_ca = format!("sslmode=verify-full&sslrootcert={other_ca}");
        match connect(&pg, "localhost", &wrong_ca).await {
            Err(WireError::Tls(why)) => assert!(
                why.contains(
                    "the server's certificate does not verify: issued by CN=Sluice test ca, \
                     not by a CA of sslrootcert"
                ),
                "{why}"
            ),
            other => panic!("expected a TLS failure, got {:?}", other.err()),
        }
        match connect(&pg, "127.0.0.1", &full).await {
            Err(WireError::Tls(why)) => assert!(why.contains("not valid for name"), "{why}"),
            other => panic!("expected a TLS failure, got {:?}", other.err()),
        }
        match connect(&pg, "127.0.0.1", "sslmode=disable").await {
            Err(WireError::Server { code, message }) => assert!(
                code == "28000" && message.contains("no encryption"),
                "{code} {message}"
            ),
            other => panic!("expected the server's refusal, got {:?}", other.err()),
        }
    }

    #[test]
    fn lsns_round_trip_in_postgres_text_form() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("nope"), None);
    }
}
