//! TLS for MariaDB/MySQL connections, as MySQL clients spell it in the URL (`ssl-mode`,
//! `ssl-ca`), through mysql_async's rustls support with the ring provider (no OpenSSL).
//!
//! ```text
//!   ssl-mode          attempts                        the server's certificate
//!   DISABLED          plain                           -
//!   PREFERRED         TLS if offered, else plain      not checked        (the default, as MySQL clients)
//!   REQUIRED          TLS                             not checked; with ssl-ca, its chain
//!   VERIFY_CA         TLS                             its chain, up to ssl-ca
//!   VERIFY_IDENTITY   TLS                             its chain and that it names the host
//! ```
//!
//! The rule is the one both SQL drivers share ([`sluice_sqlkit::tls`]). `ssl-ca` is a
//! PEM file of CA certificates, read here (so its errors name the option) and handed to
//! mysql_async as bytes; the bundled public roots are never trusted. `VERIFY_CA` and
//! `VERIFY_IDENTITY` need it, as in MySQL clients.
//!
//! A limit of mysql_async 0.37 under rustls 0.23: it skips the host-name check (for
//! `VERIFY_CA`, and `REQUIRED` with `ssl-ca`) by matching the text of rustls's error,
//! which rustls no longer spells that way, so those modes check the host name too: fail
//! closed, never open. Under REQUIRED and stronger the connection stays on TCP (no
//! switch to the server's Unix socket, which carries no TLS).

use mysql_async::SslOpts;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{OptionValues, UrlTls, url_option};
use sluice_sqlkit::tls::{self, Check, Strength, ca_certificates};
use std::path::PathBuf;

/// MySQL clients' `--ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    /// `ssl-mode`'s values, as MySQL clients spell them (any case).
    pub const VALUES: OptionValues<SslMode> = OptionValues {
        option: "ssl-mode",
        values: &[
            ("DISABLED", SslMode::Disabled),
            ("PREFERRED", SslMode::Preferred),
            ("REQUIRED", SslMode::Required),
            ("VERIFY_CA", SslMode::VerifyCa),
            ("VERIFY_IDENTITY", SslMode::VerifyIdentity),
        ],
        ignore_case: true,
    };

    fn name(self) -> &'static str {
        Self::VALUES.name(self)
    }

    fn strength(self) -> Strength {
        match self {
            SslMode::Disabled => Strength::Off,
            SslMode::Preferred => Strength::Weak,
            SslMode::Required => Strength::Require,
            SslMode::VerifyCa => Strength::VerifyCa,
            SslMode::VerifyIdentity => Strength::VerifyFull,
        }
    }
}

/// The TLS settings of one endpoint, as its URL spells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    /// The `ssl-ca` file.
    pub ca: Option<PathBuf>,
}

impl UrlTls for Tls {
    /// Taken out before mysql_async parses the rest: it refuses names it does not know.
    const URL_OPTIONS: &'static [&'static str] = &["ssl-mode", "ssl-ca"];

    /// Reads `ssl-mode` (default `PREFERRED`, any case) and `ssl-ca` from the URL's
    /// `options`; a verifying mode without a CA file is a configuration error.
    fn from_url_options(options: &[(String, String)]) -> Result<Tls> {
        // mysql_async's own TLS options would be overridden by `ssl-mode`: refused.
        if let Some((name, _)) = (options.iter()).find(|(name, _)| {
            [
                "require_ssl",
                "verify_ca",
                "verify_identity",
                "built_in_roots",
            ]
            .contains(&&**name)
        }) {
            return Err(Error::Config(format!(
                "endpoint config: url: {name}: TLS is set with ssl-mode ({}) and ssl-ca",
                SslMode::VALUES.names()
            )));
        }
        let mode = SslMode::VALUES.read(options, SslMode::Preferred)?;
        let tls = Tls {
            mode,
            ca: url_option(options, "ssl-ca").map(PathBuf::from),
        };
        if tls.ca.is_none() && matches!(mode, SslMode::VerifyCa | SslMode::VerifyIdentity) {
            return Err(
                SslMode::VALUES.refuse(mode, "needs ssl-ca=<PEM file of the CA certificates>")
            );
        }
        Ok(tls)
    }
}

impl Tls {
    /// Whether a server without TLS may be talked to in plain text (`PREFERRED`).
    pub fn falls_back_to_plain(&self) -> bool {
        self.mode == SslMode::Preferred
    }

    /// Whether the connection must be encrypted: then it stays on TCP.
    pub fn required(&self) -> bool {
        !matches!(self.mode, SslMode::Disabled | SslMode::Preferred)
    }

    /// The options behind this TLS, as errors name them: `ssl-mode=VERIFY_CA
    /// ssl-ca=/etc/ca.pem`.
    pub fn describe(&self) -> String {
        let ca = self.ca.as_ref().map(|ca| ca.display());
        let ca = ca.as_ref().map(|ca| ("ssl-ca", ca as _));
        tls::describe(("ssl-mode", self.mode.name()), ca)
    }

    /// mysql_async's settings for the TLS attempt (`None` when `DISABLED`); reads the CA
    /// file (off the async workers).
    pub async fn ssl_opts(&self) -> Result<Option<SslOpts>> {
        let Some(check) = Check::of(self.mode.strength(), self.ca.is_some()) else {
            return Ok(None);
        };
        let check_chain = check != Check::Nothing;
        let check_host = check == Check::ChainAndHost;
        let mut roots = Vec::new();
        if let Some(ca) = self.ca.as_ref().filter(|_| check_chain) {
            let pem = tokio::fs::read(ca).await;
            roots = (ca_certificates("ssl-ca", ca, pem)?.into_iter())
                .map(|der| der.to_vec().into())
                .collect();
        }
        Ok(Some(
            SslOpts::default()
                .with_root_certs(roots)
                // Unchecked, the bundled roots are never consulted, but mysql_async
                // refuses to build a verifier without any.
                .with_disable_built_in_roots(check_chain)
                .with_danger_accept_invalid_certs(!check_chain)
                .with_danger_skip_domain_validation(!check_host),
        ))
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
    fn ssl_mode_reads_every_mysql_value_in_any_case_and_defaults_to_preferred() {
        assert_eq!(tls(&[]).unwrap().mode, SslMode::Preferred);
        for &(name, mode) in SslMode::VALUES.values {
            let ca = ("ssl-ca", "/ca.pem");
            assert_eq!(tls(&[("ssl-mode", name), ca]).unwrap().mode, mode);
        }
        let lower = tls(&[("ssl-mode", "required")]).unwrap();
        assert_eq!(lower.mode, SslMode::Required);
        let err = tls(&[("ssl-mode", "VERIFY_FULL")]).unwrap_err().to_string();
        assert!(
            err.contains("url: ssl-mode=VERIFY_FULL: expected one of DISABLED"),
            "{err}"
        );
    }

    #[test]
    fn mysql_async_tls_options_are_refused_for_ssl_mode() {
        let err = tls(&[("require_ssl", "true")]).unwrap_err().to_string();
        assert!(
            err.contains("url: require_ssl: TLS is set with ssl-mode"),
            "{err}"
        );
    }

    #[test]
    fn verifying_modes_need_a_ca_file() {
        for mode in ["VERIFY_CA", "VERIFY_IDENTITY"] {
            let err = tls(&[("ssl-mode", mode)]).unwrap_err().to_string();
            assert!(
                err.contains(&format!("ssl-mode={mode}: needs ssl-ca=")),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn what_is_checked_follows_the_shared_rule() {
        let checks = async |query: &[(&str, &str)]| {
            let opts = tls(query).unwrap().ssl_opts().await;
            opts.ok()
                .flatten()
                .map(|opts| (!opts.accept_invalid_certs(), !opts.skip_domain_validation()))
        };
        assert_eq!(checks(&[("ssl-mode", "DISABLED")]).await, None);
        assert_eq!(checks(&[]).await, Some((false, false)));
        assert_eq!(
            checks(&[("ssl-mode", "REQUIRED")]).await,
            Some((false, false))
        );
        // The others read the CA file: an unreadable one is an error naming `ssl-ca`.
        let missing = [("ssl-mode", "VERIFY_CA"), ("ssl-ca", "/nowhere/ca.pem")];
        let err = tls(&missing)
            .unwrap()
            .ssl_opts()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("url: ssl-ca=/nowhere/ca.pem: cannot read the CA file"),
            "{err}"
        );
    }
}
