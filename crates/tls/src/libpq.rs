//! libpq's TLS options, read the same way by everything that connects to PostgreSQL
//! (the store, and both connections of the `postgres_cdc` source), and the one rule
//! the SQL stores verify by ([`Check::of`]), whatever their client library.
//!
//! ```text
//!   sslmode      attempts                      the server's certificate
//!   disable      plain                         -
//!   allow        plain, then TLS if refused    not checked
//!   prefer       TLS if offered, else plain    not checked          (the default, as libpq)
//!   require      TLS                           not checked; with sslrootcert, its chain (as libpq)
//!   verify-ca    TLS                           its chain, up to sslrootcert
//!   verify-full  TLS                           its chain and that it names the host
//! ```
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the Mozilla roots
//! bundled with the binary (`webpki-roots`; as libpq 16, only with `verify-full`).
//! `verify-ca` and `verify-full` need it: libpq's fallback `~/.postgresql/root.crt` is
//! not read. `verify-full` is rustls' own check; the verifier of `require` and
//! `verify-ca`, which checks less, is [`LaxVerifier`]. Either names the issuer of a
//! certificate another CA signed, as every TLS connection's errors do
//! (`issued by CN=…, not by a CA of sslrootcert (/etc/ca.pem)`).

use crate::{NamingServerVerifier, naming_server_verifier, provider};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use sluice_config::InvalidConfig;
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

/// A TLS mode's place in the one rule, whatever its spelling (`verify-full`,
/// `VERIFY_IDENTITY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strength {
    /// Plain text only (`disable`, `DISABLED`).
    Off,
    /// TLS when it can be had, nothing checked (`allow`, `prefer`, `PREFERRED`).
    Weak,
    /// TLS or fail (`require`, `REQUIRED`).
    Require,
    /// TLS, the chain checked (`verify-ca`, `VERIFY_CA`).
    VerifyCa,
    /// TLS, the chain and the host name checked (`verify-full`, `VERIFY_IDENTITY`).
    VerifyFull,
}

/// What the server's certificate must prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Nothing,
    Chain,
    ChainAndHost,
}

impl Check {
    /// The rule: what a mode of `strength` checks, given whether a CA file (or other
    /// roots) is named; `None` when it attempts no TLS at all.
    pub fn of(strength: Strength, has_roots: bool) -> Option<Check> {
        match strength {
            Strength::Off => None,
            Strength::Weak => Some(Check::Nothing),
            Strength::Require if has_roots => Some(Check::Chain),
            Strength::Require => Some(Check::Nothing),
            Strength::VerifyCa => Some(Check::Chain),
            Strength::VerifyFull => Some(Check::ChainAndHost),
        }
    }
}

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

/// How one connection attempt goes about TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// No SSLRequest: plain text.
    Plain,
    /// TLS if the server accepts the SSLRequest, else plain text.
    Prefer,
    /// TLS, or fail if the server refuses it.
    Require,
}

impl SslMode {
    /// `sslmode`'s values, as libpq spells them.
    pub const VALUES: &'static [(&'static str, SslMode)] = &[
        ("disable", SslMode::Disable),
        ("allow", SslMode::Allow),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    pub fn name(self) -> &'static str {
        (Self::VALUES.iter())
            .find_map(|&(name, mode)| (mode == self).then_some(name))
            .unwrap_or_default()
    }

    pub fn strength(self) -> Strength {
        match self {
            SslMode::Disable => Strength::Off,
            SslMode::Allow | SslMode::Prefer => Strength::Weak,
            SslMode::Require => Strength::Require,
            SslMode::VerifyCa => Strength::VerifyCa,
            SslMode::VerifyFull => Strength::VerifyFull,
        }
    }

    /// The first connection attempt, and the one made if the server refuses it: only
    /// `allow` tries TLS after a refused plain attempt.
    pub fn attempts(self) -> (Attempt, Option<Attempt>) {
        match self {
            SslMode::Disable => (Attempt::Plain, None),
            SslMode::Allow => (Attempt::Plain, Some(Attempt::Require)),
            SslMode::Prefer => (Attempt::Prefer, None),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => (Attempt::Require, None),
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

impl RootCert {
    /// These roots as a certificate's unknown issuer names them: `sslrootcert
    /// (/etc/ca.pem)`, `sslrootcert=system (the Mozilla roots bundled with sluice)`.
    pub fn describe(&self) -> String {
        match self {
            RootCert::File(path) => crate::describe_file("sslrootcert", path),
            RootCert::System => {
                "sslrootcert=system (the Mozilla roots bundled with sluice)".to_string()
            }
        }
    }
}

/// The TLS options of a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslOptions {
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
}

impl SslOptions {
    /// The URL options read here, taken out before tokio-postgres parses the rest: it
    /// knows only some `sslmode` values and no `sslrootcert`.
    pub const URL_OPTIONS: &'static [&'static str] = &["sslmode", "sslrootcert"];

    /// Reads `sslmode` (default `prefer`) and `sslrootcert` from a URL's query options
    /// (name, value; the last written wins, as libpq reads them). An unknown mode, and
    /// the combinations libpq refuses, are errors of place `url` naming the options:
    /// `sslmode=verify-ca: needs sslrootcert=…`.
    pub fn read(options: &[(String, String)]) -> Result<SslOptions, InvalidConfig> {
        let option = |name: &str| {
            (options.iter().rfind(|(n, _)| n == name)).map(|(_, value)| value.as_str())
        };
        let mode = match option("sslmode") {
            None => SslMode::Prefer,
            Some(written) => (SslMode::VALUES.iter())
                .find_map(|&(name, mode)| (name == written).then_some(mode))
                .ok_or_else(|| {
                    let names: Vec<&str> = SslMode::VALUES.iter().map(|(n, _)| *n).collect();
                    let names = names.join(", ");
                    InvalidConfig::new("url", format!("sslmode={written}: expected one of {names}"))
                })?,
        };
        let root_cert = option("sslrootcert").map(|value| match value {
            "system" => RootCert::System,
            path => RootCert::File(PathBuf::from(path)),
        });
        let refuse = |why: &str| {
            let message = format!("sslmode={}: {why}", mode.name());
            Err(InvalidConfig::new("url", message))
        };
        match (&root_cert, mode) {
            (None, SslMode::VerifyCa | SslMode::VerifyFull) => refuse(
                "needs sslrootcert=<PEM file of the CA certificates> (or sslrootcert=system \
                 for the public roots, with verify-full)",
            ),
            (Some(RootCert::System), mode) if mode != SslMode::VerifyFull => {
                refuse("sslrootcert=system needs sslmode=verify-full (as libpq)")
            }
            _ => Ok(SslOptions { mode, root_cert }),
        }
    }

    /// What the server's certificate must prove (nothing when no TLS is attempted).
    pub fn check(&self) -> Check {
        let check = Check::of(self.mode.strength(), self.root_cert.is_some());
        check.unwrap_or(Check::Nothing)
    }

    /// The options as errors name them: `sslmode=verify-full sslrootcert=/etc/ca.pem`.
    pub fn describe(&self) -> String {
        match &self.root_cert {
            None => format!("sslmode={}", self.mode.name()),
            Some(RootCert::System) => format!("sslmode={} sslrootcert=system", self.mode.name()),
            Some(RootCert::File(path)) => {
                format!(
                    "sslmode={} sslrootcert={}",
                    self.mode.name(),
                    path.display()
                )
            }
        }
    }

    /// The rustls configuration of these options, the CA file read now (place `url`).
    pub fn client_config(&self) -> Result<ClientConfig, InvalidConfig> {
        let check = self.check();
        let trusted = (self.root_cert.as_ref()).map_or_else(String::new, RootCert::describe);
        let roots = match (&self.root_cert, check) {
            (None, _) | (_, Check::Nothing) => RootCertStore::empty(),
            (Some(RootCert::System), _) => system_roots(),
            (Some(RootCert::File(path)), _) => crate::roots("url", path).map_err(|e| {
                let message = format!("sslrootcert={}: {}", path.display(), e.message);
                InvalidConfig::new("url", message)
            })?,
        };
        client_config(check, roots, &trusted).map_err(|e| InvalidConfig::new("url", e.to_string()))
    }
}

/// The query options of `url` (after its first `?`, percent-decoded, in the order
/// written), and `url` without those named in `names`, for a client library that would
/// refuse them; the other options keep their spelling.
pub fn split_url(url: &str, names: &[&str]) -> (Vec<(String, String)>, String) {
    let decode = |text: &str| -> String {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map_or_else(|_| text.to_owned(), Cow::into_owned)
    };
    let Some((base, query)) = url.split_once('?') else {
        return (Vec::new(), url.to_owned());
    };
    let (mut options, mut kept) = (Vec::new(), Vec::new());
    for option in query.split('&').filter(|option| !option.is_empty()) {
        let (name, value) = option.split_once('=').unwrap_or((option, ""));
        let name = decode(name);
        if !names.contains(&name.as_str()) {
            kept.push(option);
        }
        options.push((name, decode(value)));
    }
    let rest = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (options, rest)
}

/// The Mozilla roots bundled with the binary (`sslrootcert=system`).
pub fn system_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// The client configuration that checks what `check` says against `roots`: rustls'
/// own verifier for [`Check::ChainAndHost`], [`LaxVerifier`] for less. A certificate
/// another CA signed fails naming its issuer and `trusted`, what `roots` are
/// ([`RootCert::describe`]).
pub fn client_config(
    check: Check,
    roots: RootCertStore,
    trusted: &str,
) -> Result<ClientConfig, rustls::Error> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let chain = || {
        naming_server_verifier(roots, provider.clone(), trusted.to_string())
            .map_err(|err| rustls::Error::General(err.to_string()))
    };
    let config = match check {
        Check::ChainAndHost => builder
            .dangerous()
            .with_custom_certificate_verifier(chain()?),
        Check::Chain | Check::Nothing => {
            let chain = (check == Check::Chain).then(chain).transpose()?;
            let verifier = LaxVerifier {
                chain,
                algorithms: provider.signature_verification_algorithms,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
    };
    Ok(config.with_no_client_auth())
}

/// The verifier of `require` and `verify-ca`: the chain up to the roots when `chain` is
/// set, never the host name. The handshake's signatures are always checked, so the
/// peer holds the key of the certificate it presented.
#[derive(Debug)]
struct LaxVerifier {
    chain: Option<Arc<NamingServerVerifier>>,
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
    ) -> Result<ServerCertVerified, rustls::Error> {
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(query: &[(&str, &str)]) -> Result<SslOptions, InvalidConfig> {
        let options: Vec<(String, String)> = (query.iter())
            .map(|&(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        SslOptions::read(&options)
    }

    #[test]
    fn require_checks_the_chain_only_with_roots_and_weak_modes_never() {
        use Strength::*;
        assert_eq!(Check::of(Off, true), None);
        assert_eq!(Check::of(Weak, true), Some(Check::Nothing));
        assert_eq!(Check::of(Require, false), Some(Check::Nothing));
        assert_eq!(Check::of(Require, true), Some(Check::Chain));
        assert_eq!(Check::of(VerifyCa, true), Some(Check::Chain));
        assert_eq!(Check::of(VerifyFull, true), Some(Check::ChainAndHost));
    }

    #[test]
    fn sslmode_reads_every_libpq_value_and_defaults_to_prefer() {
        assert_eq!(tls(&[]).unwrap().mode, SslMode::Prefer);
        for &(name, mode) in SslMode::VALUES {
            let root_cert = ("sslrootcert", "/ca.pem");
            assert_eq!(tls(&[("sslmode", name), root_cert]).unwrap().mode, mode);
        }
        let err = tls(&[("sslmode", "verify_full")]).unwrap_err();
        assert_eq!(err.place, "url");
        assert!(
            (err.message).starts_with("sslmode=verify_full: expected one of disable"),
            "{err}"
        );
    }

    #[test]
    fn what_is_checked_follows_libpq() {
        let check = |query: &[(&str, &str)]| tls(query).unwrap().check();
        assert_eq!(check(&[("sslmode", "require")]), Check::Nothing);
        let prefer = [("sslmode", "prefer"), ("sslrootcert", "/ca")];
        assert_eq!(check(&prefer), Check::Nothing);
        let require = [("sslmode", "require"), ("sslrootcert", "/ca")];
        assert_eq!(check(&require), Check::Chain);
        let verify_ca = [("sslmode", "verify-ca"), ("sslrootcert", "/ca")];
        assert_eq!(check(&verify_ca), Check::Chain);
        let full = [("sslmode", "verify-full"), ("sslrootcert", "system")];
        assert_eq!(check(&full), Check::ChainAndHost);
    }

    #[test]
    fn verifying_modes_need_a_root_certificate_and_system_roots_need_verify_full() {
        let err = tls(&[("sslmode", "verify-ca")]).unwrap_err();
        assert!(
            err.message
                .starts_with("sslmode=verify-ca: needs sslrootcert="),
            "{err}"
        );
        let system = [("sslmode", "verify-ca"), ("sslrootcert", "system")];
        let err = tls(&system).unwrap_err();
        assert!(
            err.message
                .contains("sslrootcert=system needs sslmode=verify-full"),
            "{err}"
        );
    }

    #[test]
    fn allow_tries_plain_first_then_tls() {
        assert_eq!(
            SslMode::Allow.attempts(),
            (Attempt::Plain, Some(Attempt::Require))
        );
    }

    #[test]
    fn the_url_loses_only_the_options_named() {
        let url =
            "postgres://u@h/db?sslmode=verify-full&application_name=a&sslrootcert=%2Fca%20x.pem";
        let (options, rest) = split_url(url, SslOptions::URL_OPTIONS);
        assert_eq!(rest, "postgres://u@h/db?application_name=a");
        let tls = SslOptions::read(&options).unwrap();
        assert_eq!(tls.describe(), "sslmode=verify-full sslrootcert=/ca x.pem");
        let (options, rest) = split_url("postgres://u@h/db?sslmode=disable", &["sslmode"]);
        assert_eq!((options.len(), rest.as_str()), (1, "postgres://u@h/db"));
    }
}
