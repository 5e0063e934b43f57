//! A small blocking HTTP/1.1 client of the servers Sluice runs (the ingest server, the
//! status API), for `sluice status`, benchmarks, the torture scenarios and tests: one
//! keep-alive connection, requests in turn, bodies framed by
//! `Content-Length` (as the server sends them). Not a general client: no TLS, no
//! chunked responses, no redirects.

use serde_json::Value;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a request may wait for its answer (a commit): generous, as a test's
/// pipeline may be slow to start.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A connection to the server at `address`, carrying `token`.
pub struct Client {
    address: SocketAddr,
    token: String,
    connection: Option<BufReader<TcpStream>>,
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
            connection: None,
        }
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

fn read_response(connection: &mut BufReader<TcpStream>) -> io::Result<Response> {
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
