//! What the user writes: `nats: {url: nats://127.0.0.1:4222, stream: EVENTS}`, with
//! `subject`, `start`, `meta`, `tls` and `auth` optional. Strict: unknown keys are
//! errors. `tls` and `auth` are the output's too ([`sluice_nats_client`]).

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sluice_nats_client::{Auth, Server};
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::config::nullable_string;
use sluice_source_sdk::tls::ClientTls;
use std::path::Path;

/// A NATS JetStream stream, read by stream sequence (no durable consumer).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "NATS JetStream stream")]
pub struct NatsConfig {
    /// The server, nats://host:port, or tls://host:port to require TLS.
    // `host:port` is taken too.
    #[schemars(length(min = 1))]
    pub url: String,
    /// TLS: the CA file the server's certificate must chain to (it must also name the
    /// url's host), and a client certificate for mutual TLS. Setting it requires TLS,
    /// whatever the url's scheme.
    #[serde(default)]
    #[schemars(with = "ClientTls")]
    pub tls: Option<ClientTls>,
    /// How the connection authenticates: user and password (or password_file), token
    /// (or token_file), nkey_file or creds_file; one of them.
    #[serde(default)]
    #[schemars(with = "Auth")]
    pub auth: Option<Auth>,
    /// The JetStream stream read; its retention must be limits.
    #[schemars(length(min = 1))]
    pub stream: String,
    /// Only messages whose subject matches this filter (events.>).
    #[serde(default)]
    #[schemars(with = "String")]
    pub subject: Option<String>,
    /// Where a source with no committed position begins: first, last, new, or a stream
    /// sequence.
    #[serde(default)]
    #[schemars(schema_with = "start_schema")]
    pub start: Start,
    /// The top-level property receiving each message's stream, subject, sequence,
    /// timestamp and headers; null for none.
    // `null` hands the message over as it is.
    #[serde(default = "default_meta")]
    #[schemars(schema_with = "nullable_string")]
    pub meta: Option<String>,
}

/// The default `meta` property.
pub const DEFAULT_META: &str = "_meta";

fn default_meta() -> Option<String> {
    Some(DEFAULT_META.to_string())
}

/// Where reading begins when no committed position says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// The stream's first message still held.
    #[default]
    First,
    /// The last message (matching `subject`) held at start, then what follows.
    Last,
    /// Only messages published after the source started.
    New,
    /// This stream sequence (1-based).
    Sequence(u64),
}

/// As it is written: `first`, `last`, `new`, or the sequence.
impl Serialize for Start {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Start::First => s.serialize_str("first"),
            Start::Last => s.serialize_str("last"),
            Start::New => s.serialize_str("new"),
            Start::Sequence(sequence) => s.serialize_u64(*sequence),
        }
    }
}

/// The schema of [`Start`] as it is written.
fn start_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"oneOf": [
        {"type": "string", "enum": ["first", "last", "new"]},
        {"type": "integer", "minimum": 1}
    ]})
}

impl<'de> Deserialize<'de> for Start {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Start, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Sequence(u64),
        }
        let expected = "expected first, last, new or a stream sequence (an integer from 1)";
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
            Raw::Word(w) if w == "first" => Ok(Start::First),
            Raw::Word(w) if w == "last" => Ok(Start::Last),
            Raw::Word(w) if w == "new" => Ok(Start::New),
            Raw::Sequence(n) if n >= 1 => Ok(Start::Sequence(n)),
            Raw::Word(w) => Err(serde::de::Error::custom(format!("{w:?}: {expected}"))),
            Raw::Sequence(n) => Err(serde::de::Error::custom(format!("{n}: {expected}"))),
        }
    }
}

impl NatsConfig {
    /// What serde cannot check, with relative paths made relative to `base_dir` (the
    /// pipeline file's folder): names the server would refuse or misread, and the TLS
    /// and secret files, read now, so a missing or wrong one fails here naming it.
    pub fn check(&mut self, base_dir: &Path) -> Result<(), InvalidConfig> {
        if let Some(tls) = &mut self.tls {
            tls.resolve(base_dir);
        }
        if let Some(auth) = &mut self.auth {
            auth.resolve(base_dir);
        }
        self.server().check()?;
        sluice_nats_client::check_stream(&self.stream)
            .map_err(|why| InvalidConfig::new("stream", why))?;
        if let Some(subject) = &self.subject
            && (subject.is_empty()
                || subject.contains(char::is_whitespace)
                || subject.split('.').any(str::is_empty))
        {
            return Err(InvalidConfig::new(
                "subject",
                format!(
                    "{subject:?} is not a subject filter: dot-separated tokens, none \
                     empty, no spaces (e.g. events.> or events.*.eu)"
                ),
            ));
        }
        if self.meta.as_deref() == Some("") {
            return Err(InvalidConfig::new(
                "meta",
                "an empty property name; name one (the default is _meta), or write \
                 meta: null for no metadata",
            ));
        }
        Ok(())
    }

    /// The server and how to reach it.
    pub fn server(&self) -> Server {
        Server {
            url: self.url.clone(),
            tls: self.tls.clone(),
            auth: self.auth.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::{parse, schema_for};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        let schema = schema_for::<NatsConfig>();
        assert_eq!(schema["properties"]["start"]["default"], "first");
        assert_eq!(schema["properties"]["meta"]["default"], DEFAULT_META);
        assert_schema_judges(
            &schema,
            &[
                json!({"url": "nats://127.0.0.1:4222", "stream": "EVENTS"}),
                json!({"url": "127.0.0.1:4222", "stream": "EVENTS", "subject": "events.>",
                       "start": 17, "meta": null}),
                json!({"url": "nats://h:4222", "stream": "S", "start": "new"}),
                json!({"url": "tls://h:4222", "stream": "S", "tls": {"ca": "ca.crt"},
                       "auth": {"user": "sluice", "password": "${NATS_PASSWORD}"}}),
                json!({"url": "nats://h:4222", "stream": "S",
                       "auth": {"nkey_file": "sluice.nk"}}),
            ],
            &[
                json!({"url": "nats://h:4222", "stream": "S", "topic": "x"}),
                json!({"url": "nats://h:4222", "stream": "S", "start": 0}),
                json!({"url": "nats://h:4222", "stream": "S", "start": "earliest"}),
                json!({"url": "nats://h:4222"}),
                json!({"url": "nats://h:4222", "stream": "S", "auth": {"pass": "p"}}),
                json!({"url": "nats://h:4222", "stream": "S", "tls": {"cafile": "c"}}),
            ],
        );
    }

    fn parsed(value: serde_json::Value) -> Result<NatsConfig, InvalidConfig> {
        let mut config: NatsConfig = parse(value)?;
        config.check(Path::new("/pipelines"))?;
        Ok(config)
    }

    #[test]
    fn defaults_read_from_the_first_message_with_metadata_under_meta() {
        let config = parsed(json!({"url": "nats://127.0.0.1:4222", "stream": "EVENTS"})).unwrap();
        assert_eq!(config.start, Start::First);
        assert_eq!(config.subject, None);
        assert_eq!(config.meta.as_deref(), Some("_meta"));
        let config = parsed(json!({
            "url": "127.0.0.1:4222", "stream": "EVENTS", "subject": "events.>",
            "start": 17, "meta": null
        }))
        .unwrap();
        assert_eq!(config.start, Start::Sequence(17));
        assert_eq!(config.meta, None);
        for (word, start) in [
            ("first", Start::First),
            ("last", Start::Last),
            ("new", Start::New),
        ] {
            let config = parsed(json!({"url": "nats://h:4222", "stream": "S", "start": word}));
            assert_eq!(config.unwrap().start, start);
        }
    }

    #[test]
    fn errors_name_their_place() {
        for (config, place, needle) in [
            (
                json!({"url": "nats://h:4222"}),
                "",
                "missing field `stream`",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "topic": "x"}),
                "topic",
                "unknown field `topic`",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "start": "earliest"}),
                "start",
                "\"earliest\": expected first, last, new",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "start": 0}),
                "start",
                "0: expected",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "start": -3}),
                "start",
                "expected first",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "EV.X"}),
                "stream",
                "not a stream name",
            ),
            (
                json!({"url": "nats://h:4222", "stream": ""}),
                "stream",
                "not a stream name",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "subject": "a..b"}),
                "subject",
                "not a subject filter",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S", "meta": ""}),
                "meta",
                "meta: null",
            ),
            (
                json!({"url": "http://h:80:9", "stream": "S"}),
                "url",
                "not a NATS server address",
            ),
            (
                json!({"url": "ws://h:4222", "stream": "S"}),
                "url",
                "only nats:// and tls://",
            ),
            (
                json!({"url": "tls://h:4222", "stream": "S"}),
                "tls",
                "asks for TLS: set tls (ca:",
            ),
            (
                json!({"url": "tls://h:4222", "stream": "S", "tls": {"ca": "certs/ca.crt"}}),
                "tls.ca",
                "cannot read the certificate file /pipelines/certs/ca.crt",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S",
                       "auth": {"user": "sluice", "password": "p", "token": "t"}}),
                "auth",
                "user and token are both set",
            ),
            (
                json!({"url": "nats://h:4222", "stream": "S",
                       "auth": {"nkey_file": "sluice.nk"}}),
                "auth.nkey_file",
                "cannot read /pipelines/sluice.nk",
            ),
        ] {
            let error = parsed(config.clone()).unwrap_err();
            assert_eq!(error.place, place, "{config}: {error}");
            assert!(error.message.contains(needle), "{config}: {error}");
        }
    }
}
