//! What the SQL drivers' TLS shares, whatever the client library: the one verification
//! rule ([`Check::of`], from [`libpq`]), reading the CA file the URL names, naming the
//! options in errors ([`describe`]), and saying why a handshake failed.
//!
//! Both drivers verify by one rule, libpq's: a weak mode (`prefer`, MySQL's
//! `PREFERRED`) encrypts when it can and checks nothing; `require`/`REQUIRED`
//! encrypts or fails, and checks the chain only when a CA file is given; `verify-ca`/
//! `VERIFY_CA` checks the chain up to the CA file; `verify-full`/`VERIFY_IDENTITY` also
//! checks that the certificate names the host. Failures that retrying cannot change (an
//! unreadable CA file, a certificate that does not verify) are not retryable.

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sluice_driver_sdk::{Error, Result};
use std::fmt::Display;
use std::path::Path;

/// The rule and libpq's options, shared with the PostgreSQL CDC source.
pub use sluice_tls::libpq::{self, Check, Strength};

/// The options behind an endpoint's TLS, as errors name them: `sslmode=verify-full
/// sslrootcert=/etc/ca.pem`; `mode` and `roots` are (option, value) pairs.
pub fn describe(mode: (&str, &str), roots: Option<(&str, &dyn Display)>) -> String {
    match roots {
        None => format!("{}={}", mode.0, mode.1),
        Some((option, value)) => format!("{}={} {option}={value}", mode.0, mode.1),
    }
}

/// The certificates of the PEM CA file `path`, as `read` from it, named by the URL
/// option `option` (e.g. `sslrootcert`) in errors: an unreadable file, one that is not
/// PEM, and one holding no certificate are configuration errors.
pub fn ca_certificates(
    option: &str,
    path: &Path,
    read: std::io::Result<Vec<u8>>,
) -> Result<Vec<CertificateDer<'static>>> {
    let place = format!("endpoint config: url: {option}={}", path.display());
    let pem =
        read.map_err(|err| Error::Config(format!("{place}: cannot read the CA file ({err})")))?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|err| Error::Config(format!("{place}: not a PEM CA file ({err})")))?;
    if certificates.is_empty() {
        return Err(Error::Config(format!(
            "{place}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(certificates)
}

/// Why a TLS handshake failed: the one wording every connection uses.
pub use sluice_tls::handshake_failure;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_unreadable_or_holds_no_certificate_names_the_option() {
        let path = Path::new("/nowhere/ca.pem");
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let err = ca_certificates("ssl-ca", path, Err(missing)).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string()
                .contains("url: ssl-ca=/nowhere/ca.pem: cannot read the CA file (No such file)"),
            "{err}"
        );
        let err = ca_certificates("sslrootcert", path, Ok(b"not a certificate".to_vec()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sslrootcert=/nowhere/ca.pem: holds no PEM certificate"),
            "{err}"
        );
    }

    #[test]
    fn a_certificate_failure_inside_an_io_error_is_named() {
        let invalid = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, invalid);
        assert_eq!(
            handshake_failure(&io).as_deref(),
            Some("the server's certificate does not verify: UnknownIssuer")
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(handshake_failure(&plain), None);
    }
}
