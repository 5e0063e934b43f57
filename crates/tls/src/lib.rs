//! TLS for the connections Sluice serves and makes, on rustls with the ring provider
//! (no OpenSSL, no process-wide default provider): one set of options per side, read the
//! same way wherever a pipeline file writes them.
//!
//! ```text
//!  ServerTls {certificate, key, client_ca?}  ─ acceptor(place) ─▶ TlsAcceptor   (listeners)
//!  ClientTls {ca?, certificate?, key?}       ─ connector(place) ─▶ TlsConnector (clients)
//!  TcpListener + TlsAcceptor ─ TlsListener::new ─▶ an axum listener serving HTTPS
//! ```
//!
//! Every file is PEM, and every error names the option that holds it (`tls.client_ca`),
//! the file, and what is wrong with it. A certificate that does not chain to the trusted
//! CAs fails naming its issuer (`issued by CN=…, not by a CA of …`), on both sides: the
//! usual mistake is a certificate signed by another CA than the one configured. A
//! client with no `ca` trusts the operating system's roots (`rustls-native-certs`: on
//! Linux the files `openssl-probe` finds, such as `/etc/ssl/certs`, read without OpenSSL).

mod der;
pub mod libpq;
mod listener;

pub use der::issuer;
pub use listener::TlsListener;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    AlertDescription, CertificateError, DigitallySignedStruct, DistinguishedName, OtherError,
    RootCertStore, SignatureScheme,
};
use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::{InvalidConfig, resolve_path};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;
pub use tokio_rustls;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What a server presents, and which clients it lets in.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The server's certificate chain, a PEM file (its own certificate first).
    pub certificate: PathBuf,
    /// The certificate's private key, a PEM file (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: a PEM file of the CAs whose client certificates are let in. When set,
    /// every client must present a certificate signed by one of them.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Makes relative paths relative to `base_dir` (the pipeline file's folder).
    pub fn resolve(&mut self, base_dir: &Path) {
        resolve_path(&mut self.certificate, base_dir);
        resolve_path(&mut self.key, base_dir);
        if let Some(ca) = &mut self.client_ca {
            resolve_path(ca, base_dir);
        }
    }

    /// The acceptor these options describe, its files read now; `place` is where the
    /// options are written (`tls`), for errors.
    pub fn acceptor(&self, place: &str) -> Result<TlsAcceptor, InvalidConfig> {
        let provider = provider();
        let chain = certificates(&format!("{place}.certificate"), &self.certificate)?;
        let key = private_key(&format!("{place}.key"), &self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| InvalidConfig::new(place, e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let option = format!("{place}.client_ca");
                let roots = roots(&option, path)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| InvalidConfig::new(&option, e.to_string()))?;
                builder.with_client_cert_verifier(Arc::new(NamingClientVerifier {
                    inner: verifier,
                    trusted: describe_file(&option, path),
                }))
            }
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            InvalidConfig::new(
                format!("{place}.key"),
                format!("{}: {e}", self.key.display()),
            )
        })?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// How a client checks the server it connects to, and what it presents.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// The CAs the server's certificate must chain to, a PEM file; when unset, the
    /// operating system's trusted roots. The certificate must also name the host
    /// connected to.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// A client certificate to present (mutual TLS), a PEM file; needs `key`.
    #[serde(default)]
    pub certificate: Option<PathBuf>,
    /// The client certificate's private key, a PEM file.
    #[serde(default)]
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// Makes relative paths relative to `base_dir` (the pipeline file's folder).
    pub fn resolve(&mut self, base_dir: &Path) {
        let paths = [&mut self.ca, &mut self.certificate, &mut self.key];
        for path in paths.into_iter().flatten() {
            resolve_path(path, base_dir);
        }
    }

    /// The connector these options describe, its files read now; `place` is where the
    /// options are written (`tls`), for errors.
    pub fn connector(&self, place: &str) -> Result<TlsConnector, InvalidConfig> {
        self.client_config(place).map(TlsConnector::from)
    }

    /// The rustls configuration behind [`ClientTls::connector`], for blocking clients.
    pub fn client_config(&self, place: &str) -> Result<Arc<rustls::ClientConfig>, InvalidConfig> {
        let provider = provider();
        let option = format!("{place}.ca");
        let (roots, trusted) = match &self.ca {
            Some(path) => (roots(&option, path)?, describe_file(&option, path)),
            None => (native_roots(&option)?, SYSTEM_ROOTS.to_string()),
        };
        let verifier = naming_server_verifier(roots, provider.clone(), trusted)
            .map_err(|e| InvalidConfig::new(&option, e.to_string()))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| InvalidConfig::new(place, e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.certificate, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(certificate), Some(key)) => {
                let chain = certificates(&format!("{place}.certificate"), certificate)?;
                let key_der = private_key(&format!("{place}.key"), key)?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    InvalidConfig::new(format!("{place}.key"), format!("{}: {e}", key.display()))
                })?
            }
            (Some(_), None) => {
                return Err(InvalidConfig::new(
                    format!("{place}.key"),
                    "a client certificate needs its key: set key as well",
                ));
            }
            (None, Some(_)) => {
                return Err(InvalidConfig::new(
                    format!("{place}.certificate"),
                    "a key without its certificate: set certificate as well",
                ));
            }
        };
        Ok(Arc::new(config))
    }
}

/// The server name a client checks the certificate against: a DNS name or an IP.
pub fn server_name(host: &str) -> Result<ServerName<'static>, InvalidConfig> {
    ServerName::try_from(host.to_string())
        .map_err(|e| InvalidConfig::new("", format!("{host:?} is not a server name: {e}")))
}

/// Why a client's TLS handshake failed, when `err` or an error under it is a rustls
/// error (directly, or inside the `io::Error` a TLS stream returns): the server's
/// certificate that does not verify (naming its issuer when another CA signed it), a
/// server refusing this client's certificate, or another handshake failure.
pub fn handshake_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    failure(err, "server")
}

/// [`handshake_failure`] of a handshake a server took part in: the client's certificate.
pub(crate) fn client_handshake_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    failure(err, "client")
}

fn failure(err: &(dyn std::error::Error + 'static), peer: &str) -> Option<String> {
    let mut source = Some(err);
    while let Some(err) = source {
        let inner = (err.downcast_ref::<std::io::Error>()).and_then(|io| io.get_ref());
        let tls = (err.downcast_ref::<rustls::Error>())
            .or_else(|| inner.and_then(|inner| inner.downcast_ref::<rustls::Error>()));
        if let Some(tls) = tls {
            return Some(match tls {
                rustls::Error::AlertReceived(
                    alert @ (AlertDescription::BadCertificate
                    | AlertDescription::CertificateRequired
                    | AlertDescription::UnknownCA),
                ) => format!(
                    "the server refused this client's certificate ({alert:?}): set \
                     tls.certificate and tls.key to a certificate the server's CA signed"
                ),
                // Another error's Display is its Debug: ours (the issuer) is read as said.
                rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
                    format!("the {peer}'s certificate does not verify: {other}")
                }
                rustls::Error::InvalidCertificate(reason) => {
                    format!("the {peer}'s certificate does not verify: {reason}")
                }
                other => format!("the TLS handshake failed: {other}"),
            });
        }
        source = err.source();
    }
    None
}

/// The one provider every configuration is built with.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `tls.client_ca (/etc/ca.pem)`: a trusted file as messages name it.
fn describe_file(option: &str, path: &Path) -> String {
    format!("{option} ({})", path.display())
}

fn read(option: &str, path: &Path, what: &str) -> Result<Vec<u8>, InvalidConfig> {
    std::fs::read(path).map_err(|e| {
        InvalidConfig::new(
            option,
            format!("cannot read the {what} {}: {e}", path.display()),
        )
    })
}

/// The certificates of the PEM file `path` (at least one), named `option` in errors.
pub fn certificates(
    option: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, InvalidConfig> {
    let pem = read(option, path, "certificate file")?;
    let found = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            InvalidConfig::new(option, format!("{} is not a PEM file: {e}", path.display()))
        })?;
    if found.is_empty() {
        return Err(InvalidConfig::new(
            option,
            format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
        ));
    }
    Ok(found)
}

/// The private key of the PEM file `path`, named `option` in errors.
fn private_key(option: &str, path: &Path) -> Result<PrivateKeyDer<'static>, InvalidConfig> {
    let pem = read(option, path, "key file")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        InvalidConfig::new(
            option,
            format!("{} holds no PEM private key: {e}", path.display()),
        )
    })
}

fn roots(option: &str, path: &Path) -> Result<RootCertStore, InvalidConfig> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(option, path)? {
        roots.add(certificate).map_err(|e| {
            InvalidConfig::new(
                option,
                format!("{}: not a CA certificate rustls takes: {e}", path.display()),
            )
        })?;
    }
    Ok(roots)
}

/// The trusted roots of a client with no `ca`, as messages name them.
const SYSTEM_ROOTS: &str = "the operating system's trusted roots";

/// The operating system's trusted roots (a client's `option`, unset): an error naming
/// `option` when none can be loaded, as on a machine with no CA bundle installed.
fn native_roots(option: &str) -> Result<RootCertStore, InvalidConfig> {
    system_roots(option, rustls_native_certs::load_native_certs())
}

/// The roots of what the operating system's store gave (`found`), or the error of
/// [`native_roots`] when none is usable.
fn system_roots(
    option: &str,
    found: rustls_native_certs::CertificateResult,
) -> Result<RootCertStore, InvalidConfig> {
    let mut roots = RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = (found.errors.iter()).map(ToString::to_string).collect();
        let why = match (errors.is_empty(), unusable) {
            (true, 0) => "none was found".to_string(),
            (true, _) => format!("none of the {unusable} found is usable"),
            (false, _) => errors.join("; "),
        };
        return Err(InvalidConfig::new(
            option,
            format!(
                "unset, so the operating system's trusted roots are used, but none could \
                 be loaded ({why}): set {option} to a PEM file of the CAs to trust, or \
                 install the system's CA certificates (SSL_CERT_FILE or SSL_CERT_DIR name \
                 other places)"
            ),
        ));
    }
    Ok(roots)
}

/// webpki's server check of the chain up to `roots` and the server's name, an unknown
/// issuer said with the issuer's name and `trusted` (what `roots` are, as messages
/// name them). Fails only when `roots` is empty.
fn naming_server_verifier(
    roots: RootCertStore,
    provider: Arc<CryptoProvider>,
    trusted: String,
) -> Result<Arc<NamingServerVerifier>, rustls::client::VerifierBuilderError> {
    let inner =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()?;
    Ok(Arc::new(NamingServerVerifier { inner, trusted }))
}

/// An unknown issuer, said with the issuer's name and the file it is not in.
fn unknown_issuer(
    error: rustls::Error,
    end_entity: &CertificateDer<'_>,
    trusted: &str,
) -> rustls::Error {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            let issuer = issuer(end_entity).unwrap_or_else(|| "an unreadable issuer".into());
            let message = format!("issued by {issuer}, not by a CA of {trusted}");
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(Named(
                message,
            )))))
        }
        other => other,
    }
}

#[derive(Debug)]
struct Named(String);

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Named {}

/// The handshake-signature methods of a verifier wrapping `inner`: checked as `inner`
/// checks them (the naming verifiers only reword a failed chain).
macro_rules! signatures_of_inner {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
}

/// webpki's client check, whose unknown issuer names the issuer.
#[derive(Debug)]
struct NamingClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trusted: String,
}

impl ClientCertVerifier for NamingClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now);
        verified.map_err(|e| unknown_issuer(e, end_entity, &self.trusted))
    }

    signatures_of_inner!();
}

/// webpki's server check (chain and name), whose unknown issuer names the issuer.
#[derive(Debug)]
struct NamingServerVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    trusted: String,
}

impl ServerCertVerifier for NamingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = (self.inner).verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        verified.map_err(|e| unknown_issuer(e, end_entity, &self.trusted))
    }

    signatures_of_inner!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_without_a_ca_file_trusts_the_operating_systems_roots() {
        let roots = native_roots("tls.ca").expect("this machine's CA bundle (/etc/ssl/certs)");
        assert!(!roots.is_empty());
        let tls = ClientTls {
            ca: None,
            certificate: None,
            key: None,
        };
        tls.client_config("tls").unwrap();
        let parsed: ClientTls = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, tls);
    }

    #[test]
    fn no_system_roots_at_all_is_an_error_naming_the_option() {
        let empty = rustls_native_certs::CertificateResult::default();
        let err = system_roots("sinks.redis.tls.ca", empty).unwrap_err();
        assert_eq!(err.place, "sinks.redis.tls.ca");
        assert!(
            err.message
                .contains("none could be loaded (none was found)")
                && err.message.contains("set sinks.redis.tls.ca to a PEM file"),
            "{err}"
        );
    }
}
