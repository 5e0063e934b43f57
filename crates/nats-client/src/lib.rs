//! The NATS client settings the `nats` source and the `nats` output share, in one home
//! both depend on (neither depends on the other): what a server address and a stream
//! name may be, and how a connection is made, secured and authenticated.
//!
//! A stream the output creates can therefore always be named in a source, and both
//! reach a server the same way ([`Server`]): `nats://` or `tls://`, each connection
//! attempt and request bounded by [`TIMEOUT`]. Both configurations embed the same keys:
//!
//! ```text
//!  url: tls://nats.internal:4222        tls:// requires TLS; nats:// with tls set too
//!  tls: {ca, certificate?, key?}        sluice_tls::ClientTls: the server's certificate
//!                                       chains to ca and names the host; mutual TLS
//!  auth: {user, password | password_file}  or {token | token_file}
//!        or {nkey_file} or {creds_file}    exactly one way ([`Auth`])
//! ```
//!
//! Secrets (a password, a token, an NKey seed) are read when a connection is made, so a
//! rotated file is picked up at the next connection; they appear in no message and no
//! `Debug` output. A connection that fails says whether retrying can help
//! ([`ConnectError`]): refused credentials or TLS settings cannot, an unreachable
//! server may.

mod auth;

pub use auth::Auth;

use async_nats::{Client, ConnectErrorKind, ConnectOptions, ServerAddr};
use sluice_config::InvalidConfig;
use sluice_tls::ClientTls;
use std::time::Duration;

/// How long connecting, or a request to the server, may take before it fails
/// (retryably): long enough for a server across the world, short enough that a dead
/// one surfaces before an operator wonders.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The keys of a configuration embedding `tls` and `auth` whose values are paths, made
/// relative to the pipeline file's folder (an output kind's `paths`).
pub const PATHS: &[&str] = &[
    "tls.ca",
    "tls.certificate",
    "tls.key",
    "auth.password_file",
    "auth.token_file",
    "auth.nkey_file",
    "auth.creds_file",
];

/// A server and how to reach it, as a `nats` source's or output's configuration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `nats://host:port`, `tls://host:port` or `host:port`.
    pub url: String,
    pub tls: Option<ClientTls>,
    pub auth: Option<Auth>,
}

/// A URL alone: a server reached in plain text, without authentication (tools and
/// tests on the local server).
impl From<&str> for Server {
    fn from(url: &str) -> Server {
        Server {
            url: url.to_string(),
            tls: None,
            auth: None,
        }
    }
}

/// Why a connection failed, and whether a retry can help.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server refused the settings (credentials, TLS): change them; a retry cannot
    /// help.
    #[error("{0}")]
    Refused(String),
    /// The server did not answer, or the connection broke: a retry may help.
    #[error("{0}")]
    Unavailable(String),
}

impl Server {
    /// What serde cannot check, without connecting: the address, the TLS files and the
    /// one way of authenticating, its files read. Errors name their key (`auth.user`).
    pub fn check(&self) -> Result<(), InvalidConfig> {
        self.options().map(drop)
    }

    /// Connects, TLS and credentials as configured.
    pub async fn connect(&self) -> Result<Client, ConnectError> {
        let options = self
            .options()
            .map_err(|invalid| ConnectError::Refused(invalid.to_string()))?;
        options
            .connect(self.url.as_str())
            .await
            .map_err(|e| self.explain(e))
    }

    /// The client's options: timeouts, TLS, the one way of authenticating.
    fn options(&self) -> Result<ConnectOptions, InvalidConfig> {
        let addr = check_url(&self.url).map_err(|why| InvalidConfig::new("url", why))?;
        let options = ConnectOptions::new()
            .connection_timeout(TIMEOUT)
            .request_timeout(Some(TIMEOUT));
        let options = match &self.tls {
            Some(tls) => {
                let config = tls.client_config("tls")?;
                options
                    .tls_client_config(config.as_ref().clone())
                    .require_tls(true)
            }
            None if addr.tls_required() => {
                return Err(InvalidConfig::new(
                    "tls",
                    format!(
                        "{} asks for TLS: set tls (ca: the CA file the server's \
                         certificate chains to)",
                        self.url
                    ),
                ));
            }
            None => options,
        };
        match &self.auth {
            Some(_) if addr.has_user_pass() => Err(InvalidConfig::new(
                "url",
                "holds a user and password (user:password@) and auth is set too: a \
                 connection authenticates one way, so keep only auth",
            )),
            Some(auth) => auth.apply(options),
            None => Ok(options),
        }
    }

    /// `error` as the user should read it: refused settings say which to change.
    fn explain(&self, error: async_nats::ConnectError) -> ConnectError {
        let tls_failure = sluice_tls::handshake_failure(&error);
        match (error.kind(), &self.auth, &self.tls, tls_failure) {
            (ConnectErrorKind::AuthorizationViolation, Some(auth), _, _) => {
                ConnectError::Refused(format!(
                    "the server refused {} (authorization violation): check {}",
                    auth.who(),
                    auth.keys()
                ))
            }
            (ConnectErrorKind::AuthorizationViolation, None, _, _) => ConnectError::Refused(
                "the server requires authentication (authorization violation): set \
                     auth (user and password, token, nkey_file or creds_file)"
                    .to_string(),
            ),
            (ConnectErrorKind::Authentication, Some(auth), _, _) => ConnectError::Refused(format!(
                "{} could not sign the server's nonce: {error}",
                auth.who()
            )),
            // Without `tls` the client speaks TLS only when the server demands it.
            (ConnectErrorKind::Tls, _, None, _) | (_, _, None, Some(_)) => {
                ConnectError::Refused(format!(
                    "the server requires TLS: write the url as tls://host:port and set \
                     tls (ca: the CA file its certificate chains to) ({error})"
                ))
            }
            (_, _, Some(_), Some(why)) => ConnectError::Refused(why),
            (ConnectErrorKind::Tls | ConnectErrorKind::ServerParse, _, _, _) => {
                ConnectError::Refused(error.to_string())
            }
            _ => ConnectError::Unavailable(error.to_string()),
        }
    }
}

/// Checks a server address, `nats://host:port`, `tls://host:port` (or `host:port`); the
/// error says what to write instead.
pub fn check_url(url: &str) -> Result<ServerAddr, String> {
    let bad_url = |why: String| {
        format!("{url:?} is not a NATS server address ({why}); write e.g. nats://127.0.0.1:4222")
    };
    let addr = url
        .parse::<ServerAddr>()
        .map_err(|e| bad_url(e.to_string()))?;
    match addr.scheme() {
        "nats" | "tls" => Ok(addr),
        _ => Err(bad_url("only nats:// and tls:// are supported".to_string())),
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
    use std::path::PathBuf;

    #[test]
    fn nats_and_tls_addresses_are_taken() {
        for url in ["nats://127.0.0.1:4222", "127.0.0.1:4222", "tls://h:4222"] {
            assert!(check_url(url).is_ok(), "{url}");
        }
        let error = check_url("ws://h:4222").unwrap_err();
        assert!(error.contains("only nats:// and tls://"), "{error}");
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

    #[test]
    fn a_tls_url_needs_tls_and_a_url_user_excludes_auth() {
        let error = Server::from("tls://h:4222").check().unwrap_err();
        assert_eq!(error.place, "tls");
        assert!(error.message.contains("set tls (ca:"), "{error}");
        let server = Server {
            auth: Some(Auth {
                token: Some("t".into()),
                ..Auth::default()
            }),
            ..Server::from("nats://u:p@h:4222")
        };
        let error = server.check().unwrap_err();
        assert_eq!(error.place, "url");
        assert!(error.message.contains("keep only auth"), "{error}");
        assert!(!error.to_string().contains(":p@"), "{error}");
    }

    #[test]
    fn the_tls_files_are_read_when_checked() {
        let server = Server {
            tls: Some(ClientTls {
                ca: Some(PathBuf::from("/nonexistent/ca.crt")),
                certificate: None,
                key: None,
            }),
            ..Server::from("tls://h:4222")
        };
        let error = server.check().unwrap_err();
        assert_eq!(error.place, "tls.ca");
        assert!(error.message.contains("/nonexistent/ca.crt"), "{error}");
    }
}
