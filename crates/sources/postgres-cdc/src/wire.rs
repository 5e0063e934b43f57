//! The replication connection: PostgreSQL's frontend/backend protocol over TCP with
//! `replication=database`, which tokio-postgres cannot open (it has no CopyBoth mode).
//! Message encoding and SCRAM/MD5 come from `postgres-protocol`; the framing of what
//! the server sends, and the few messages a walsender sends, are read here.
//!
//! ```text
//!  connect (startup, auth) ─▶ query("CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT")   (rows as text)
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
use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

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
}

/// A failure of the replication connection: the server's error (with its SQLSTATE),
/// or I/O.
#[derive(Debug)]
pub enum WireError {
    Server { code: String, message: String },
    Io(io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Server { code, message } => write!(f, "{message} (SQLSTATE {code})"),
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
    framed: Framed<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Connection {
    /// Connects, authenticates (trust, password, MD5 or SCRAM-SHA-256) and waits for
    /// the server to be ready.
    pub async fn connect(target: &Target) -> Result<Connection, WireError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, Self::connect_now(target)).await {
            Ok(connected) => connected,
            Err(_) => Err(WireError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting took over {}s", CONNECT_TIMEOUT.as_secs()),
            ))),
        }
    }

    async fn connect_now(target: &Target) -> Result<Connection, WireError> {
        let stream = TcpStream::connect((target.host.as_str(), target.port)).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
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
    framed: Framed<OwnedReadHalf>,
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
    write: OwnedWriteHalf,
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

    #[test]
    fn lsns_round_trip_in_postgres_text_form() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("nope"), None);
    }
}
