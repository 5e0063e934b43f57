//! Secrets out of text meant for people: passwords in URLs (`scheme://user:***@host`),
//! the values of password, token and seed parameters (`?password=***`, `"token":
//! "***"`, Debug's `password: Some("***")`), bearer tokens (`Bearer ***`) and NKey seeds
//! wherever they stand (`SU…`, as a NATS creds file holds them).
//!
//! One function over any text, not a careful `Display` per config: a secret reaches
//! messages through configs, connectors and client libraries alike (a NATS client logs
//! its server's `Url` with the password), so the binary applies [`redact`] where text
//! leaves the process: every log line and the error it exits with. It lives here, at
//! the bottom of the crate graph (no Sluice dependency), where the runtime, the binary
//! and every source can reach it. [`redact_json`] does the same to a configuration
//! shown whole (the status page's), field by field.

use serde_json::Value;
use std::borrow::Cow;

/// What a secret is replaced with.
pub const HIDDEN: &str = "***";

/// Parameter names whose value is a secret, matched without regard to case.
const SECRET_NAMES: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "token",
    "access_token",
    "secret",
    "api_key",
    "seed",
];

/// `text` with every secret it holds replaced by [`HIDDEN`].
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut secrets = url_passwords(text);
    secrets.extend(named_values(text));
    secrets.extend(bearer_tokens(text));
    secrets.extend(nkey_seeds(text));
    if secrets.is_empty() {
        return Cow::Borrowed(text);
    }
    secrets.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, end) in secrets {
        if end <= copied {
            continue;
        }
        if start >= copied {
            out.push_str(&text[copied..start]);
            out.push_str(HIDDEN);
        }
        copied = end;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// `value` fit to show: the value of every field named as a secret (`"password":
/// "…"`, any case) hidden whole, whatever its type, and every other string [`redact`]ed
/// (a URL's password, a bearer token).
pub fn redact_json(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(redact(text).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(redact_json).collect()),
        Value::Object(fields) => Value::Object(
            (fields.iter())
                .map(|(name, value)| {
                    let secret = SECRET_NAMES.iter().any(|s| s.eq_ignore_ascii_case(name));
                    let shown = match secret {
                        true => Value::String(HIDDEN.to_string()),
                        false => redact_json(value),
                    };
                    (name.clone(), shown)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Byte ranges of the passwords of `scheme://user:password@host` URLs.
fn url_passwords(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for (scheme_end, _) in text.match_indices("://") {
        let authority = scheme_end + 3;
        let end = (authority..bytes.len())
            .find(|&i| ends_authority(bytes[i]))
            .unwrap_or(bytes.len());
        let Some(at) = text[authority..end].rfind('@') else {
            continue;
        };
        let userinfo = &text[authority..authority + at];
        if let Some(colon) = userinfo.find(':')
            && colon + 1 < at
        {
            found.push((authority + colon + 1, authority + at));
        }
    }
    found
}

/// Whether `b` ends a URL's authority (host part) in running text, JSON or Debug.
fn ends_authority(b: u8) -> bool {
    matches!(
        b,
        b'/' | b'?' | b'#' | b'"' | b'\'' | b'\\' | b'<' | b'>' | b'`' | b',' | b')' | b']'
    ) || b.is_ascii_whitespace()
}

/// Byte ranges of the values of [`SECRET_NAMES`]: `name=value` (a URL query, a libpq
/// connection string), `"name": "value"` (JSON, also escaped inside JSON) and
/// `name: "value"` or `name: Some("value")` (Debug).
fn named_values(text: &str) -> Vec<(usize, usize)> {
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for name in SECRET_NAMES {
        for (start, _) in lower.match_indices(name) {
            let starts_word = start == 0 || !is_word(bytes[start - 1]);
            if !starts_word {
                continue;
            }
            let mut i = start + name.len();
            i += quote_at(bytes, i).map_or(0, <[u8]>::len);
            i = skip_spaces(bytes, i);
            let separator = bytes.get(i).copied();
            if !matches!(separator, Some(b'=' | b':')) {
                continue;
            }
            i = skip_spaces(bytes, i + 1);
            if separator == Some(b':') && text[i..].starts_with("Some(") {
                i += "Some(".len();
            }
            let value = match quote_at(bytes, i) {
                Some(quote) => {
                    let from = i + quote.len();
                    let to = find(bytes, from, quote).unwrap_or(bytes.len());
                    (from, to)
                }
                // Unquoted values only after `=`: `name: word` is prose more often than
                // a secret.
                None if separator == Some(b'=') => {
                    let to = (i..bytes.len())
                        .find(|&j| ends_value(bytes[j]))
                        .unwrap_or(bytes.len());
                    (i, to)
                }
                None => continue,
            };
            if value.0 < value.1 {
                found.push(value);
            }
        }
    }
    found
}

/// Byte ranges of the tokens of `Bearer <token>` (an Authorization header's scheme, as
/// HTTP spells it: prose says "bearer token").
fn bearer_tokens(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for (start, scheme) in text.match_indices("Bearer ") {
        if start > 0 && is_word(bytes[start - 1]) {
            continue;
        }
        let from = start + scheme.len();
        let to = (from..bytes.len())
            .find(|&i| !is_token(bytes[i]))
            .unwrap_or(bytes.len());
        if from < to {
            found.push((from, to));
        }
    }
    found
}

/// Byte ranges of NKey seeds: a word of 58 characters, `S`, a key type (user, account,
/// operator, server, cluster, curve or private: `UAONCXP`), then base32 (`A-Z2-7`).
/// A public key starts with its type, never with `S`, so it is kept.
fn nkey_seeds(text: &str) -> Vec<(usize, usize)> {
    const SEED_LEN: usize = 58;
    let bytes = text.as_bytes();
    let is_base32 = |b: &u8| b.is_ascii_uppercase() || (b'2'..=b'7').contains(b);
    let mut found: Vec<(usize, usize)> = Vec::new();
    for (start, _) in text.match_indices('S') {
        let end = start + SEED_LEN;
        let Some(seed) = bytes.get(start..end) else {
            break;
        };
        let whole_word = (start == 0 || !is_word(bytes[start - 1]))
            && bytes.get(end).is_none_or(|&b| !is_word(b));
        if whole_word && b"UAONCXP".contains(&seed[1]) && seed[2..].iter().all(is_base32) {
            found.push((start, end));
        }
    }
    found
}

/// The quote at `i`, if one is there: `"`, `'`, or `\"` (a quote inside a JSON string).
fn quote_at(bytes: &[u8], i: usize) -> Option<&'static [u8]> {
    match (bytes.get(i), bytes.get(i + 1)) {
        (Some(b'\\'), Some(b'"')) => Some(b"\\\""),
        (Some(b'"'), _) => Some(b"\""),
        (Some(b'\''), _) => Some(b"'"),
        _ => None,
    }
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..bytes.len()).find(|&i| bytes[i..].starts_with(needle))
}

fn skip_spaces(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i) == Some(&b' ') {
        i += 1;
    }
    i
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `b` ends an unquoted `name=value` value.
fn ends_value(b: u8) -> bool {
    matches!(
        b,
        b'&' | b'#' | b'"' | b'\'' | b'\\' | b',' | b';' | b')' | b'}'
    ) || b.is_ascii_whitespace()
}

/// The characters of an RFC 6750 bearer token.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

#[cfg(test)]
mod tests {
    use super::{redact, redact_json};
    use serde_json::json;

    #[test]
    fn url_passwords_are_hidden_and_the_rest_kept() {
        assert_eq!(
            redact("connecting to postgres://alice:s3cret@db.example:5432/sales failed"),
            "connecting to postgres://alice:***@db.example:5432/sales failed"
        );
        assert_eq!(redact("redis://:s3cret@h:6379/1"), "redis://:***@h:6379/1");
        // Nothing to hide: the text itself comes back.
        for plain in [
            "postgres://alice@db.example/sales",
            "nats://127.0.0.1:4222",
            "http://[::1]:8080/ingest/views",
            "no url here: just a@b and c:d",
        ] {
            assert!(
                matches!(redact(plain), std::borrow::Cow::Borrowed(_)),
                "{plain}"
            );
        }
    }

    #[test]
    fn percent_encoded_and_at_sign_passwords_are_hidden_whole() {
        assert_eq!(
            redact("mysql://bob:p%40ss%3Aw0rd@h/db"),
            "mysql://bob:***@h/db"
        );
        assert_eq!(redact("mysql://bob:p@ss@h/db"), "mysql://bob:***@h/db");
    }

    #[test]
    fn every_url_of_a_text_is_redacted() {
        assert_eq!(
            redact("from nats://u:a@n1:4222, then \"postgres://v:b@p/db\" and kafka://k:9092"),
            "from nats://u:***@n1:4222, then \"postgres://v:***@p/db\" and kafka://k:9092"
        );
    }

    #[test]
    fn password_and_token_parameters_are_hidden() {
        assert_eq!(
            redact("postgres://h/db?user=u&password=s3cret&sslmode=require"),
            "postgres://h/db?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            redact("host=h PASSWORD='s e c' dbname=d"),
            "host=h PASSWORD='***' dbname=d"
        );
        assert_eq!(
            redact(r#"{"listen":"127.0.0.1:8080","token": "t0k"}"#),
            r#"{"listen":"127.0.0.1:8080","token": "***"}"#
        );
        assert_eq!(
            redact(r#"{"message":"config {\"token\":\"t0k\"}"}"#),
            r#"{"message":"config {\"token\":\"***\"}"}"#
        );
        assert_eq!(
            redact(r#"Url { username: "u", password: Some("s3cret"), host: None }"#),
            r#"Url { username: "u", password: Some("***"), host: None }"#
        );
        // Prose and other names are left alone.
        for plain in [
            "no bearer token: send Authorization: Bearer <token>",
            "the tokens=3 and passwords_checked=1",
        ] {
            assert_eq!(redact(plain), plain);
        }
    }

    #[test]
    fn nkey_seeds_are_hidden_wherever_they_stand_and_public_keys_kept() {
        let seed = "SUAIO3FHUX5PNV2LQIIP7TZ3N4L7TX3W53MQGEIVYFIGA635OZCKEYHFLM";
        let public = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4";
        assert_eq!(
            redact(&format!(
                "-----BEGIN USER NKEY SEED-----\n{seed}\n------END"
            )),
            "-----BEGIN USER NKEY SEED-----\n***\n------END"
        );
        assert_eq!(
            redact(&format!("bad key {seed}: {public}")),
            format!("bad key ***: {public}")
        );
        assert_eq!(
            redact(&format!(r#"{{"seed": "x", "nkey": "{public}"}}"#)),
            format!(r#"{{"seed": "***", "nkey": "{public}"}}"#)
        );
        // A longer word, or one in lower case, is not a seed.
        for plain in [
            format!("{seed}X"),
            seed.to_lowercase(),
            "STREAM_EVENTS".to_string(),
        ] {
            assert_eq!(redact(&plain), plain);
        }
    }

    #[test]
    fn bearer_tokens_are_hidden() {
        assert_eq!(
            redact("Authorization: Bearer abc.DEF-123_~+/="),
            "Authorization: Bearer ***"
        );
        assert_eq!(redact("Bearer x y"), "Bearer *** y");
    }

    #[test]
    fn a_kafka_login_keeps_its_user_and_password_file_and_hides_its_password() {
        let sasl = json!({"mechanism": "SCRAM-SHA-512", "username": "sluice",
                          "password": "s3cret", "password_file": "secrets/kafka"});
        let config = json!({"kafka": {"brokers": "k:9093", "tls": {"ca": "ca.crt"}, "sasl": sasl}});
        assert_eq!(
            redact_json(&config),
            json!({"kafka": {"brokers": "k:9093", "tls": {"ca": "ca.crt"},
                   "sasl": {"mechanism": "SCRAM-SHA-512", "username": "sluice",
                            "password": "***", "password_file": "secrets/kafka"}}})
        );
        // rskafka's credentials and the client builder holding them, as Debug shows them.
        assert_eq!(
            redact(r#"ScramSha256(Credentials { username: "sluice", password: "s3cret" })"#),
            r#"ScramSha256(Credentials { username: "sluice", password: "***" })"#
        );
        let file = "sasl.password_file: cannot read the password file secrets/kafka";
        assert_eq!(redact(file), file);
    }

    #[test]
    fn a_configuration_keeps_its_shape_with_its_secrets_hidden() {
        let config = json!({
            "sources": {"orders": {"kafka": {"brokers": ["k:9092"], "Password": 12345}}},
            "materializations": {"db": {"endpoint": {"postgres": {
                "url": "postgres://app:s3cret@db:5432/sales?sslmode=require",
            }}}},
            "http": {"token": {"nested": "t0k"}, "headers": ["Bearer abc"], "port": 80},
            "nats": {"auth": {"user": "sluice", "password": "pw", "token_file": "t"}},
        });
        assert_eq!(
            redact_json(&config),
            json!({
                "sources": {"orders": {"kafka": {"brokers": ["k:9092"], "Password": "***"}}},
                "materializations": {"db": {"endpoint": {"postgres": {
                    "url": "postgres://app:***@db:5432/sales?sslmode=require",
                }}}},
                "http": {"token": "***", "headers": ["Bearer ***"], "port": 80},
                "nats": {"auth": {"user": "sluice", "password": "***", "token_file": "t"}},
            })
        );
    }
}
