//! A small blocking HTTP/1.1 client of the servers Sluice runs (the ingest server, the
//! status API), for `sluice status`, benchmarks, the torture scenarios and tests: one
//! keep-alive connection, requests in turn, bodies framed by
//! `Content-Length` (as the server sends them), over TLS when given a rustls
//! configuration ([`Client::with_tls`]). Not a general client: no chunked responses,
//! no redirects.

use serde_json::Value;
use sluice_source_sdk::tls::rustls::pki_types::ServerName;
use sluice_source_sdk::tls::rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// How long a request may wait for its answer (a commit): generous, as a test's
/// pipeline may be slow to start.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A connection to the server at `address`, carrying `token`.
pub struct Client {
    address: SocketAddr,
    token: String,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    connection: Option<BufReader<Stream>>,
}

/// A connection, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// An answer: status, headers (names lower-case) and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Client {
    pub fn new(address: SocketAddr, token: &str) -> Client {
        Client {
            address,
            token: token.to_string(),
            tls: None,
            connection: None,
        }
    }

    /// Speaks TLS with `config`, checking the server's certificate against `server_name`.
    pub fn with_tls(
        mut self,
        config: Arc<ClientConfig>,
        server_name: ServerName<'static>,
    ) -> Client {
        self.tls = Some((config, server_name));
        self
    }

    /// `POST /ingest/<source>` of `body`, with `key` as its Idempotency-Key.
    pub fn ingest(&mut self, source: &str, key: Option<&str>, body: &[u8]) -> io::Result<Response> {
        let auth = format!("Bearer {}", self.token);
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(key) = key {
            headers.push(("Idempotency-Key", key));
        }
        self.request("POST", &format!("/ingest/{source}"), &headers, body)
    }

    /// A request with exactly `headers` (no token added). A failed request closes
    /// the connection; the next one opens another.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let result = self.exchange(method, path, headers, body);
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        if self.connection.is_none() {
            let stream = TcpStream::connect_timeout(&self.address, Duration::from_secs(5))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(TIMEOUT))?;
            let stream = match &self.tls {
                None => Stream::Plain(stream),
                Some((config, name)) => {
                    let tls = ClientConnection::new(config.clone(), name.clone())
                        .map_err(io::Error::other)?;
                    let mut tls = StreamOwned::new(tls, stream);
                    // The handshake now, so that a refused certificate is this call's error.
                    while tls.conn.is_handshaking() {
                        tls.conn.complete_io(&mut tls.sock)?;
                    }
                    Stream::Tls(Box::new(tls))
                }
            };
            self.connection = Some(BufReader::new(stream));
        }
        let connection = self.connection.as_mut().expect("connected above");
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.address,
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        connection.get_mut().write_all(&request)?;
        read_response(connection)
    }
}

fn read_response(connection: &mut BufReader<Stream>) -> io::Result<Response> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut line = String::new();
    if connection.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection without an answer",
        ));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not an HTTP status line: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        connection.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let (name, value) = trimmed
            .split_once(':')
            .ok_or_else(|| bad(format!("not a header: {trimmed:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| bad("an answer without Content-Length".to_string()))?;
    let mut body = vec![0; length];
    connection.read_exact(&mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}
