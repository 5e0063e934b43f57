//! TLS for PostgreSQL connections, as libpq reads `sslmode` and `sslrootcert` from the
//! URL, through rustls with the ring provider (no OpenSSL).
//!
//! The table of modes, what each checks, and the verifier of `require` and `verify-ca`
//! are [`libpq`]'s, shared with the `postgres_cdc` source so both read a
//! URL alike; the rule is the one both SQL drivers share ([`sluice_sqlkit::tls`]). Here
//! the options are read as the store's URL options, with its errors, and tried through
//! `tokio-postgres-rustls` (small, maintained, and it gives SCRAM its channel binding).

use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::UrlTls;
use sluice_sqlkit::tls::ca_certificates;
use sluice_sqlkit::tls::libpq::{self, Attempt, SslOptions};
use tokio_postgres::config::SslMode as TokioSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use sluice_sqlkit::tls::libpq::{RootCert, SslMode};

/// The TLS settings of one endpoint, as its URL spells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls(pub SslOptions);

impl UrlTls for Tls {
    const URL_OPTIONS: &'static [&'static str] = SslOptions::URL_OPTIONS;

    /// Reads `sslmode` (default `prefer`) and `sslrootcert` from the URL's `options`;
    /// combinations libpq refuses are configuration errors naming the options.
    fn from_url_options(options: &[(String, String)]) -> Result<Tls> {
        SslOptions::read(options)
            .map(Tls)
            .map_err(|err| Error::Config(format!("endpoint config: url: {}", err.message)))
    }
}

/// The tokio-postgres setting of one attempt.
pub fn tokio_attempt(attempt: Attempt) -> TokioSslMode {
    match attempt {
        Attempt::Plain => TokioSslMode::Disable,
        Attempt::Prefer => TokioSslMode::Prefer,
        Attempt::Require => TokioSslMode::Require,
    }
}

impl Tls {
    /// The first connection attempt, and the one made if the server refuses it: only
    /// `allow` tries TLS after a refused plain attempt.
    pub fn attempts(&self) -> (TokioSslMode, Option<TokioSslMode>) {
        let (first, if_refused) = self.0.mode.attempts();
        (tokio_attempt(first), if_refused.map(tokio_attempt))
    }

    /// The options behind this TLS, as errors name them: `sslmode=verify-full
    /// sslrootcert=/etc/ca.pem`.
    pub fn describe(&self) -> String {
        self.0.describe()
    }

    /// The connector of these settings; reads the CA file (off the async workers).
    pub async fn connector(&self) -> Result<MakeRustlsConnect> {
        let check = self.0.check();
        let roots = match (&self.0.root_cert, check) {
            (None, _) | (_, libpq::Check::Nothing) => rustls::RootCertStore::empty(),
            (Some(RootCert::System), _) => libpq::system_roots(),
            (Some(RootCert::File(path)), _) => {
                let pem = tokio::fs::read(path).await;
                let mut roots = rustls::RootCertStore::empty();
                for certificate in ca_certificates("sslrootcert", path, pem)? {
                    roots.add(certificate).map_err(|err| {
                        Error::Config(format!(
                            "endpoint config: url: sslrootcert={}: not a usable CA \
                             certificate ({err})",
                            path.display()
                        ))
                    })?;
                }
                roots
            }
        };
        let trusted = (self.0.root_cert.as_ref()).map_or_else(String::new, RootCert::describe);
        let config = libpq::client_config(check, roots, &trusted)
            .map_err(|err| Error::store("configuring TLS", err, false))?;
        Ok(MakeRustlsConnect::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_the_stores_url_option_errors() {
        let options = [("sslmode".to_owned(), "verify-ca".to_owned())];
        let err = Tls::from_url_options(&options).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string()
                .contains("endpoint config: url: sslmode=verify-ca: needs sslrootcert="),
            "{err}"
        );
    }

    #[test]
    fn allow_tries_plain_first_then_tls() {
        let options = [("sslmode".to_owned(), "allow".to_owned())];
        assert_eq!(
            Tls::from_url_options(&options).unwrap().attempts(),
            (TokioSslMode::Disable, Some(TokioSslMode::Require))
        );
    }
}
