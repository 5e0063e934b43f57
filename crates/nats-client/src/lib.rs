//! The NATS client settings the `nats` source and the `nats` output share, in one home
//! both depend on (neither depends on the other): what a server address and a stream
//! name may be, and how a connection is made.
//!
//! A stream the output creates can therefore always be named in a source, and both
//! reach a server the same way: plain `nats://` only (TLS and WebSocket transports are
//! not built in), each connection attempt and request bounded by [`TIMEOUT`].

use async_nats::{Client, ConnectError, ConnectOptions, ServerAddr};
use std::time::Duration;

/// How long connecting, or a request to the server, may take before it fails
/// (retryably): long enough for a server across the world, short enough that a dead
/// one surfaces before an operator wonders.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the server at `url` (checked with [`check_url`]).
pub async fn connect(url: &str) -> Result<Client, ConnectError> {
    ConnectOptions::new()
        .connection_timeout(TIMEOUT)
        .request_timeout(Some(TIMEOUT))
        .connect(url)
        .await
}

/// Checks a server address, `nats://host:port` (or `host:port`); the error says what to
/// write instead.
pub fn check_url(url: &str) -> Result<(), String> {
    let bad_url = |why: String| {
        format!("{url:?} is not a NATS server address ({why}); write e.g. nats://127.0.0.1:4222")
    };
    match url.parse::<ServerAddr>() {
        Err(e) => Err(bad_url(e.to_string())),
        Ok(addr) if addr.clone().into_inner().scheme() != "nats" => {
            Err(bad_url("only plain nats:// is supported".to_string()))
        }
        Ok(_) => Ok(()),
    }
}

/// Checks a stream name as the server takes it; the error says what a name may hold.
pub fn check_stream(stream: &str) -> Result<(), String> {
    let refused = |c: char| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\');
    if stream.is_empty() || stream.contains(refused) {
        return Err(format!(
            "{stream:?} is not a stream name: a name is not empty and has no spaces, \
             '.', '*', '>', '/' or '\\'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_nats_addresses_are_taken() {
        assert_eq!(check_url("nats://127.0.0.1:4222"), Ok(()));
        assert_eq!(check_url("127.0.0.1:4222"), Ok(()));
        let error = check_url("tls://h:4222").unwrap_err();
        assert!(error.contains("only plain nats://"), "{error}");
        let error = check_url("http://h:80:9").unwrap_err();
        assert!(error.contains("is not a NATS server address"), "{error}");
    }

    #[test]
    fn stream_names_hold_no_separators_wildcards_or_spaces() {
        assert_eq!(check_stream("EVENTS_1"), Ok(()));
        for bad in ["", "EV.X", "A*", "A>", "a b", "a/b", "a\\b"] {
            let error = check_stream(bad).unwrap_err();
            assert!(error.contains("is not a stream name"), "{bad}: {error}");
        }
    }
}
