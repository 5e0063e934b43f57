//! Parsing a source kind's configuration: what every kind's parser shares with the
//! pipeline file, so that all of them read and report alike.
//!
//! - A configuration is strict (`#[serde(deny_unknown_fields)]` on the kind's type):
//!   a typo is an error, never silently ignored.
//! - An error names its place inside the kind's configuration ([`InvalidConfig`]); the
//!   runtime puts the kind's own place in front (`sources.views.file.path: ...`).
//! - Byte sizes are an integer or a string with a binary unit (`"16MiB"`), the same
//!   grammar everywhere in the pipeline file ([`parse_bytes`], [`de_bytes`]).
//! - Relative paths are relative to the pipeline file's folder ([`resolve_path`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A configuration that cannot work (the user's error: change the pipeline file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if place.is_empty() { String::new() } else { format!("{place}: ") })]
pub struct InvalidConfig {
    /// The dotted path of the offending value inside the kind's configuration
    /// (`max_document_size`, `tags[0]`); empty for the configuration as a whole.
    pub place: String,
    pub message: String,
}

impl InvalidConfig {
    pub fn new(place: impl Into<String>, message: impl Into<String>) -> InvalidConfig {
        InvalidConfig {
            place: place.into(),
            message: message.into(),
        }
    }

    /// Its place in the pipeline file, the kind's configuration being at `prefix`
    /// (`sources.views.file`): `sources.views.file.path`.
    pub fn place_in(&self, prefix: &str) -> String {
        match (prefix.is_empty(), self.place.is_empty()) {
            (_, true) => prefix.to_string(),
            (true, false) => self.place.clone(),
            (false, false) => format!("{prefix}.{}", self.place),
        }
    }
}

/// Reads a kind's configuration `C` from the value under its key, naming the place of
/// the first offending value.
pub fn parse<C: DeserializeOwned>(config: Value) -> Result<C, InvalidConfig> {
    serde_path_to_error::deserialize(config).map_err(|e| {
        let place = e.path().to_string();
        let place = if place == "." { String::new() } else { place };
        InvalidConfig::new(place, e.into_inner().to_string())
    })
}

/// Makes a relative `path` relative to the pipeline file's folder `base_dir`.
pub fn resolve_path(path: &mut PathBuf, base_dir: &Path) {
    if path.is_relative() {
        *path = base_dir.join(&*path);
    }
}

/// Parses a byte count: an integer, or a string like `"64MiB"`, `"512KiB"`, `"1GiB"`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => {
            return Err(format!(
                "invalid size {s:?}: write e.g. 65536, \"512KiB\", \"64MiB\""
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("invalid size {s:?}: write e.g. 65536, \"512KiB\", \"64MiB\""))
}

/// Deserializes a byte count written as [`parse_bytes`] reads it
/// (`#[serde(deserialize_with = "sluice_source_sdk::config::de_bytes")]`).
pub fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Int(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Int(n) => Ok(n),
        Size::Text(s) => parse_bytes(&s).map_err(serde::de::Error::custom),
    }
}

/// Parses `"250ms"`, `"2s"`, `"1m"`, `"1h"` (an integer or decimal and a unit).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let unit_secs = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {s:?}: write e.g. \"250ms\", \"2s\", \"1m\""
            ));
        }
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: write e.g. \"250ms\", \"2s\", \"1m\""))?;
    Ok(Duration::from_secs_f64(n * unit_secs))
}

/// Deserializes a duration written as [`parse_duration`] reads it.
pub fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_read_integers_and_binary_units() {
        for (text, expected) in [
            ("0", Ok(0)),
            ("65536", Ok(65536)),
            ("12B", Ok(12)),
            ("512KiB", Ok(512 << 10)),
            ("16MiB", Ok(16 << 20)),
            ("1GiB", Ok(1 << 30)),
            ("16MB", Err(())),
            ("MiB", Err(())),
            ("-1", Err(())),
            ("18446744073709551615GiB", Err(())),
        ] {
            assert_eq!(parse_bytes(text).map_err(drop), expected, "{text}");
        }
        assert!(parse_bytes("2 TB").unwrap_err().contains("\"64MiB\""));
    }

    #[test]
    fn errors_are_placed_under_the_kind() {
        for (place, prefix, expected) in [
            ("path", "sources.v.file", "sources.v.file.path"),
            ("", "sources.v.file", "sources.v.file"),
            ("path", "", "path"),
            ("", "", ""),
        ] {
            assert_eq!(InvalidConfig::new(place, "bad").place_in(prefix), expected);
        }
        assert_eq!(InvalidConfig::new("path", "bad").to_string(), "path: bad");
        assert_eq!(InvalidConfig::new("", "bad").to_string(), "bad");
    }

    #[test]
    fn parse_names_the_offending_field() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Config {
            inner: Inner,
        }
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Inner {
            #[serde(deserialize_with = "de_bytes")]
            size: u64,
        }
        let config = parse::<Config>(serde_json::json!({"inner": {"size": "2KiB"}})).unwrap();
        assert_eq!(config.inner.size, 2 << 10);
        let error = parse::<Config>(serde_json::json!({"inner": {"size": "1 lb"}})).unwrap_err();
        assert_eq!(error.place, "inner.size");
        assert!(error.message.contains("invalid size"), "{error}");
        let error = parse::<Config>(serde_json::json!({"other": 1})).unwrap_err();
        assert!(error.message.contains("unknown field `other`"), "{error}");
    }
}
