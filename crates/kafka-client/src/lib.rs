//! The Kafka client settings the `kafka` source and the `kafka` output share, in one
//! home both depend on (neither depends on the other): the bootstrap brokers, TLS and
//! SASL ([`config`]), the one place an rskafka client is built ([`Connector`]), why a
//! connection failed ([`ConnectError`]), and the key-range partitioner both sides of a
//! partitioned read agree on ([`key_range`]).
//!
//! ```text
//!  brokers, tls?, sasl? ── Connector::new (files read) ── connect(backoff) ──▶ rskafka Client
//!                                                              │ failed
//!                                      probe (our own TCP/TLS attempt) + rskafka's error
//!                                                              ▼
//!                             Refused (fix the settings) | Failed (a retry may help)
//! ```
//!
//! rskafka reports a failed connection as text only (its per-broker errors are joined
//! into one message, their types lost), so the reason is found again: a failed connect
//! is followed by one attempt of our own on the same transport ([`probe`]), which sees
//! the certificate error typed (and names the certificate's issuer, `sluice_tls`'s
//! verifier does that) or the TLS alert a TLS listener answers plain text with; what
//! the transport does not explain, the SASL step may (rskafka says `Sasl handshake
//! failed`). A refusal is not retried: the same settings are refused again.

pub mod config;
pub mod key_range;
mod probe;

pub use config::{ClientTls, Mechanism, Sasl};

use rskafka::BackoffConfig;
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use sluice_config::InvalidConfig;
use sluice_tls::rustls::ClientConfig;
use std::sync::Arc;

/// What rskafka 0.6's connection error says when the SASL exchange failed (its
/// `connection::Error::SaslFailed`, reached only as text).
const SASL_FAILED: &str = "Sasl handshake failed";

/// Why a client could not connect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The brokers refuse these settings (a certificate, TLS required, the user or its
    /// password): retrying cannot help; the message says what to change.
    #[error("{0}")]
    Refused(String),
    /// The brokers could not be reached, or failed: a retry may help.
    #[error("{0}")]
    Failed(String),
}

impl ConnectError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ConnectError::Failed(_))
    }
}

/// The settings of one client, its files read: what builds every rskafka client.
#[derive(Clone)]
pub struct Connector {
    brokers: Vec<String>,
    client_id: &'static str,
    tls: Option<Arc<ClientConfig>>,
    sasl: Option<Login>,
}

#[derive(Clone)]
struct Login {
    mechanism: Mechanism,
    username: String,
    password: String,
}

impl Connector {
    /// A client of `brokers` reached over `tls` (when set) as the `sasl` user (when
    /// set), introducing itself as `client_id`; the CA, key and password files are read
    /// now, and errors name the option (`tls.ca`, `sasl.password_file`).
    pub fn new(
        client_id: &'static str,
        brokers: &[String],
        tls: Option<&ClientTls>,
        sasl: Option<&Sasl>,
    ) -> Result<Connector, InvalidConfig> {
        let tls = tls.map(|tls| tls.client_config("tls")).transpose()?;
        let sasl = match sasl {
            None => None,
            Some(sasl) => Some(Login {
                mechanism: sasl.mechanism,
                username: sasl.username.clone(),
                password: sasl.read_password()?,
            }),
        };
        Ok(Connector {
            brokers: brokers.to_vec(),
            client_id,
            tls,
            sasl,
        })
    }

    /// A client of `brokers` over plain TCP, unauthenticated (tests, local tools).
    pub fn plain(client_id: &'static str, brokers: &[String]) -> Connector {
        Connector {
            brokers: brokers.to_vec(),
            client_id,
            tls: None,
            sasl: None,
        }
    }

    /// `a:9092,b:9092`, for messages.
    pub fn brokers(&self) -> String {
        self.brokers.join(",")
    }

    /// The builder of a client retrying as `backoff` says.
    pub fn builder(&self, backoff: BackoffConfig) -> ClientBuilder {
        let mut builder = ClientBuilder::new(self.brokers.clone())
            .client_id(self.client_id)
            .backoff_config(backoff);
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.clone());
        }
        if let Some(login) = &self.sasl {
            let credentials = Credentials::new(login.username.clone(), login.password.clone());
            builder = builder.sasl_config(match login.mechanism {
                Mechanism::Plain => SaslConfig::Plain(credentials),
                Mechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
                Mechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
            });
        }
        builder
    }

    /// A connected client (the brokers' metadata read once), connecting retried as
    /// `backoff` says; a failure says why (see the module docs).
    pub async fn connect(&self, backoff: BackoffConfig) -> Result<Client, ConnectError> {
        match self.builder(backoff).build().await {
            Ok(client) => Ok(client),
            Err(error) => Err(self.explain(&error.to_string()).await),
        }
    }

    /// Why connecting failed with rskafka's `error`.
    async fn explain(&self, error: &str) -> ConnectError {
        if let Some(refused) = probe::transport(&self.brokers, self.tls.as_ref()).await {
            return refused;
        }
        let brokers = self.brokers();
        match &self.sasl {
            Some(login) if error.contains(SASL_FAILED) => ConnectError::Refused(format!(
                "brokers {brokers} refused user {:?} authenticating with {}: check \
                 sasl.username and the password, and that the brokers enable {} for that \
                 user ({error})",
                login.username, login.mechanism, login.mechanism
            )),
            Some(_) => ConnectError::Failed(format!("connecting to brokers {brokers}: {error}")),
            None => ConnectError::Failed(format!(
                "connecting to brokers {brokers}: {error} (if the brokers require \
                 authentication, set sasl)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_is_retried() {
        assert!(ConnectError::Failed("down".into()).is_retryable());
        assert!(!ConnectError::Refused("wrong password".into()).is_retryable());
    }

    #[tokio::test]
    async fn a_refused_login_names_the_user_and_the_mechanism() {
        let sasl = Sasl {
            mechanism: Mechanism::ScramSha256,
            username: "alice".into(),
            password: Some("s3cret".into()),
            password_file: None,
        };
        // Nothing listens on the broker: the probe explains nothing, rskafka's text does.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let broker = closed.local_addr().unwrap().to_string();
        drop(closed);
        let connector = Connector::new("test", &[broker], None, Some(&sasl)).unwrap();
        let rskafka = "Connection error: all retries failed: Sasl handshake failed: API error";
        let refused = connector.explain(rskafka).await;
        let ConnectError::Refused(message) = refused else {
            panic!("{refused:?}")
        };
        assert!(
            message.contains("user \"alice\" authenticating with SCRAM-SHA-256"),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
        let failed = connector.explain("Connection error: broken pipe").await;
        assert!(failed.is_retryable(), "{failed:?}");
    }
}
