//! TLS for PostgreSQL connections, as libpq reads `sslmode` and `sslrootcert` from the
//! URL, through rustls with the ring provider (no OpenSSL).
//!
//! ```text
//!   sslmode      attempts (tokio-postgres)     the server's certificate
//!   disable      plain                         -
//!   allow        plain, then TLS if refused    not checked
//!   prefer       TLS if offered, else plain    not checked          (the default, as libpq)
//!   require      TLS                           not checked; with sslrootcert, its chain (as libpq)
//!   verify-ca    TLS                           its chain, up to sslrootcert
//!   verify-full  TLS                           its chain and that it names the host
//! ```
//!
//! The rule is the one both SQL drivers share ([`sluice_sqlkit::tls`]).
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the Mozilla roots
//! bundled with the binary (`webpki-roots`; as libpq 16, only with `verify-full`).
//! `verify-ca` and `verify-full` need it: libpq's fallback `~/.postgresql/root.crt` is
//! not read. The connector is `tokio-postgres-rustls` (small, maintained, and it gives
//! SCRAM its channel binding); only the verifier of `require` and `verify-ca`, which
//! checks less than rustls does by default, is ours.

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{OptionValues, UrlTls, url_option};
use sluice_sqlkit::tls::{self, Check, Strength, ca_certificates};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_postgres::config::SslMode as Attempt;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// `sslmode`'s values, as libpq spells them.
    pub const VALUES: OptionValues<SslMode> = OptionValues {
        option: "sslmode",
        values: &[
            ("disable", SslMode::Disable),
            ("allow", SslMode::Allow),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ],
        ignore_case: false,
    };

    fn name(self) -> &'static str {
        Self::VALUES.name(self)
    }

    fn strength(self) -> Strength {
        match self {
            SslMode::Disable => Strength::Off,
            SslMode::Allow | SslMode::Prefer => Strength::Weak,
            SslMode::Require => Strength::Require,
            SslMode::VerifyCa => Strength::VerifyCa,
            SslMode::VerifyFull => Strength::VerifyFull,
        }
    }
}

/// Where the trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    /// The Mozilla roots bundled with the binary.
    System,
}

/// The TLS settings of one endpoint, as its URL spells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
}

impl UrlTls for Tls {
    /// Taken out before tokio-postgres parses the rest: it knows only some `sslmode`
    /// values and no `sslrootcert`.
    const URL_OPTIONS: &'static [&'static str] = &["sslmode", "sslrootcert"];

    /// Reads `sslmode` (default `prefer`) and `sslrootcert` from the URL's `options`;
    /// combinations libpq refuses are configuration errors naming the options.
    fn from_url_options(options: &[(String, String)]) -> Result<Tls> {
        let mode = SslMode::VALUES.read(options, SslMode::Prefer)?;
        let root_cert = url_option(options, "sslrootcert").map(|value| match value {
            "system" => RootCert::System,
            path => RootCert::File(PathBuf::from(path)),
        });
        let tls = Tls { mode, root_cert };
        let refuse = |why: &str| Err(SslMode::VALUES.refuse(mode, why));
        match (&tls.root_cert, mode) {
            (None, SslMode::VerifyCa | SslMode::VerifyFull) => refuse(
                "needs sslrootcert=<PEM file of the CA certificates> (or sslrootcert=system \
                 for the public roots, with verify-full)",
            ),
            (Some(RootCert::System), mode) if mode != SslMode::VerifyFull => {
                refuse("sslrootcert=system needs sslmode=verify-full (as libpq)")
            }
            _ => Ok(tls),
        }
    }
}

impl Tls {
    /// The first connection attempt, and the one made if the server refuses it: only
    /// `allow` tries TLS after a refused plain attempt.
    pub fn attempts(&self) -> (Attempt, Option<Attempt>) {
        match self.mode {
            SslMode::Disable => (Attempt::Disable, None),
            SslMode::Allow => (Attempt::Disable, Some(Attempt::Require)),
            SslMode::Prefer => (Attempt::Prefer, None),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => (Attempt::Require, None),
        }
    }

    fn check(&self) -> Check {
        let check = Check::of(self.mode.strength(), self.root_cert.is_some());
        check.unwrap_or(Check::Nothing)
    }

    /// The options behind this TLS, as errors name them: `sslmode=verify-full
    /// sslrootcert=/etc/ca.pem`.
    pub fn describe(&self) -> String {
        let root_cert = self.root_cert.as_ref().map(|root_cert| match root_cert {
            RootCert::System => "system".to_owned(),
            RootCert::File(path) => path.display().to_string(),
        });
        let root_cert = root_cert.as_ref().map(|value| ("sslrootcert", value as _));
        tls::describe(("sslmode", self.mode.name()), root_cert)
    }

    /// The connector of these settings; reads the CA file (off the async workers).
    pub async fn connector(&self) -> Result<MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let check = self.check();
        let roots = match (&self.root_cert, check) {
            (None, _) | (_, Check::Nothing) => RootCertStore::empty(),
            (Some(RootCert::System), _) => RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
            (Some(RootCert::File(path)), _) => {
                let pem = tokio::fs::read(path).await;
                let mut roots = RootCertStore::empty();
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
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| Error::store("configuring TLS", err, false))?;
        let config = match check {
            Check::ChainAndHost => builder.with_root_certificates(roots),
            Check::Chain | Check::Nothing => {
                let chain = (check == Check::Chain)
                    .then(|| {
                        WebPkiServerVerifier::builder_with_provider(
                            Arc::new(roots),
                            provider.clone(),
                        )
                        .build()
                    })
                    .transpose()
                    .map_err(|err| Error::store("configuring TLS", err, false))?;
                let verifier = LaxVerifier {
                    chain,
                    algorithms: provider.signature_verification_algorithms,
                };
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(verifier))
            }
        };
        Ok(MakeRustlsConnect::new(config.with_no_client_auth()))
    }
}

/// The verifier of `require` and `verify-ca`: the chain up to the roots when `chain` is
/// set, never the host name. The handshake's signatures are always checked, so the
/// peer holds the key of the certificate it presented.
#[derive(Debug)]
struct LaxVerifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for LaxVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is verified before the name: a name error means the chain held.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(query: &[(&str, &str)]) -> Result<Tls> {
        let options: Vec<(String, String)> = (query.iter())
            .map(|&(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        Tls::from_url_options(&options)
    }

    #[test]
    fn sslmode_reads_every_libpq_value_and_defaults_to_prefer() {
        assert_eq!(tls(&[]).unwrap().mode, SslMode::Prefer);
        for &(name, mode) in SslMode::VALUES.values {
            let root_cert = ("sslrootcert", "/ca.pem");
            assert_eq!(tls(&[("sslmode", name), root_cert]).unwrap().mode, mode);
        }
        let err = tls(&[("sslmode", "verify_full")]).unwrap_err().to_string();
        assert!(
            err.contains("url: sslmode=verify_full: expected one of disable"),
            "{err}"
        );
    }

    #[test]
    fn what_is_checked_follows_libpq() {
        let check = |query: &[(&str, &str)]| tls(query).unwrap().check();
        assert_eq!(check(&[("sslmode", "require")]), Check::Nothing);
        assert_eq!(
            check(&[("sslmode", "prefer"), ("sslrootcert", "/ca")]),
            Check::Nothing
        );
        assert_eq!(
            check(&[("sslmode", "require"), ("sslrootcert", "/ca")]),
            Check::Chain
        );
        assert_eq!(
            check(&[("sslmode", "verify-ca"), ("sslrootcert", "/ca")]),
            Check::Chain
        );
        let full = [("sslmode", "verify-full"), ("sslrootcert", "system")];
        assert_eq!(check(&full), Check::ChainAndHost);
    }

    #[test]
    fn verifying_modes_need_a_root_certificate_and_system_roots_need_verify_full() {
        let err = tls(&[("sslmode", "verify-ca")]).unwrap_err().to_string();
        assert!(
            err.contains("url: sslmode=verify-ca: needs sslrootcert="),
            "{err}"
        );
        let system = [("sslmode", "verify-ca"), ("sslrootcert", "system")];
        let err = tls(&system).unwrap_err().to_string();
        assert!(
            err.contains("sslrootcert=system needs sslmode=verify-full"),
            "{err}"
        );
    }

    #[test]
    fn allow_tries_plain_first_then_tls() {
        assert_eq!(
            tls(&[("sslmode", "allow")]).unwrap().attempts(),
            (Attempt::Disable, Some(Attempt::Require))
        );
    }
}
