//! What the source and the output both write to reach the brokers: `brokers`, read by
//! [`brokers`], and the `tls` ([`ClientTls`]) and `sasl` ([`Sasl`]) options. Strict:
//! unknown keys are errors, and every error names its place.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use sluice_config::{InvalidConfig, resolve_path};
use std::fmt;
use std::path::{Path, PathBuf};

pub use sluice_tls::ClientTls;

/// Who the client authenticates as, by SASL (after TLS, when `tls` is set too).
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sasl {
    /// PLAIN (the password sent as it is: use it with tls), SCRAM-SHA-256 or
    /// SCRAM-SHA-512.
    pub mechanism: Mechanism,
    /// The user authenticated as.
    #[schemars(length(min = 1))]
    pub username: String,
    /// The user's password (`${ENV}` reads it from the environment); or set
    /// password_file.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password (a trailing newline is not part of it), relative to
    /// the pipeline file's folder; instead of password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// A SASL mechanism.
// Those rskafka speaks with a user and password (OAUTHBEARER needs a token source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Mechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        })
    }
}

/// The password never shows, whoever formats the options.
impl fmt::Debug for Sasl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .finish()
    }
}

impl Sasl {
    /// What serde cannot check: one password, given one way.
    pub fn check(&self) -> Result<(), InvalidConfig> {
        if self.username.is_empty() {
            return Err(InvalidConfig::new(
                "sasl.username",
                "the user name is empty",
            ));
        }
        match (&self.password, &self.password_file) {
            (Some(_), Some(_)) => Err(InvalidConfig::new(
                "sasl",
                "set password or password_file, not both",
            )),
            (None, None) => Err(InvalidConfig::new(
                "sasl",
                "set the user's password, or password_file naming a file that holds it",
            )),
            _ => Ok(()),
        }
    }

    /// Makes `password_file` relative to `base_dir` (the pipeline file's folder).
    pub fn resolve(&mut self, base_dir: &Path) {
        if let Some(path) = &mut self.password_file {
            resolve_path(path, base_dir);
        }
    }

    /// The password, read from `password_file` when that is how it is given.
    pub(crate) fn read_password(&self) -> Result<String, InvalidConfig> {
        self.check()?;
        match (&self.password, &self.password_file) {
            (Some(password), _) => Ok(password.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    InvalidConfig::new(
                        "sasl.password_file",
                        format!("cannot read the password file {}: {e}", path.display()),
                    )
                })?;
                let password = text.strip_suffix('\n').unwrap_or(&text);
                Ok(password.strip_suffix('\r').unwrap_or(password).to_string())
            }
            (None, None) => unreachable!("checked above"),
        }
    }
}

/// The keys of a configuration embedding `tls` and `sasl` whose values are paths, made
/// relative to the pipeline file's folder (an output kind's `paths`).
pub const PATHS: &[&str] = &["tls.ca", "tls.certificate", "tls.key", "sasl.password_file"];

/// Checks and resolves the `tls` and `sasl` options of a configuration, as its
/// `prepare` does: paths made relative to `base_dir`.
pub fn prepare(
    tls: Option<&mut ClientTls>,
    sasl: Option<&mut Sasl>,
    base_dir: &Path,
) -> Result<(), InvalidConfig> {
    if let Some(tls) = tls {
        tls.resolve(base_dir);
    }
    if let Some(sasl) = sasl {
        sasl.check()?;
        sasl.resolve(base_dir);
    }
    Ok(())
}

/// The schema of bootstrap brokers as [`brokers`] reads them.
pub fn brokers_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"oneOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}}
    ]})
}

/// Bootstrap brokers as the source and the output take them: `"host:port"`,
/// `"h1:p1,h2:p2"` or a list of either (so `["${KAFKA_BROKERS}"]` holding
/// `a:9092,b:9092` is two brokers); each `host:port`.
pub fn brokers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct BrokersVisitor;

    impl<'de> Visitor<'de> for BrokersVisitor {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"host:port, or a list of them (["h1:9092", "h2:9092"])"#)
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<String>, E> {
            split_brokers(s).map_err(E::custom)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut brokers = Vec::new();
            while let Some(Brokers(listed)) = seq.next_element()? {
                brokers.extend(listed);
            }
            if brokers.is_empty() {
                return Err(de::Error::custom("name at least one broker (host:port)"));
            }
            Ok(brokers)
        }
    }

    d.deserialize_any(BrokersVisitor)
}

/// One item of a list (a broker, or a comma-separated string of them), checked as it
/// is read (so that an error names its index).
struct Brokers(Vec<String>);

impl<'de> Deserialize<'de> for Brokers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Brokers, D::Error> {
        let item = String::deserialize(d)?;
        split_brokers(&item).map(Brokers).map_err(de::Error::custom)
    }
}

fn split_brokers(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(|broker| checked_broker(broker.trim()))
        .collect()
}

/// `broker` if it is `host:port`; else why not.
pub fn checked_broker(broker: &str) -> Result<String, String> {
    match broker.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(broker.to_string())
        }
        _ => Err(format!("{broker:?} is not host:port")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sasl(value: serde_json::Value) -> Result<Sasl, InvalidConfig> {
        sluice_config::parse::<Sasl>(value)
    }

    #[test]
    fn sasl_takes_one_password_given_one_way() {
        let given = sasl(json!({"mechanism": "SCRAM-SHA-512", "username": "u", "password": "p"}));
        let given = given.unwrap();
        assert_eq!(given.mechanism, Mechanism::ScramSha512);
        assert_eq!(given.read_password().unwrap(), "p");
        let both = json!({"mechanism": "PLAIN", "username": "u", "password": "p",
                          "password_file": "f"});
        let err = sasl(both).unwrap().check().unwrap_err().to_string();
        assert_eq!(err, "sasl: set password or password_file, not both");
        let none = sasl(json!({"mechanism": "PLAIN", "username": "u"})).unwrap();
        assert!(
            none.check()
                .unwrap_err()
                .to_string()
                .starts_with("sasl: set the user's password")
        );
        let err = sasl(json!({"mechanism": "GSSAPI", "username": "u"})).unwrap_err();
        assert_eq!(err.place, "mechanism");
        let err = sasl(json!({"mechanism": "PLAIN", "username": "u", "pasword": "p"})).unwrap_err();
        assert!(err.message.contains("unknown field `pasword`"), "{err}");
    }

    #[test]
    fn a_password_file_is_relative_to_the_pipeline_and_loses_its_newline() {
        let dir = std::env::temp_dir().join(format!("sluice-kafka-sasl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("password"), "s3cret\r\n").unwrap();
        let mut given = sasl(json!({"mechanism": "SCRAM-SHA-256", "username": "u",
                                    "password_file": "password"}))
        .unwrap();
        prepare(None, Some(&mut given), &dir).unwrap();
        assert_eq!(
            given.password_file.as_deref(),
            Some(dir.join("password").as_path())
        );
        assert_eq!(given.read_password().unwrap(), "s3cret");
        given.password_file = Some(dir.join("missing"));
        let err = given.read_password().unwrap_err();
        assert_eq!(err.place, "sasl.password_file");
        assert!(
            err.message.contains("cannot read the password file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_password_never_shows_in_debug() {
        let given = sasl(json!({"mechanism": "PLAIN", "username": "alice", "password": "s3cret"}));
        let shown = format!("{:?}", given.unwrap());
        assert!(
            !shown.contains("s3cret") && shown.contains("alice"),
            "{shown}"
        );
    }
}
