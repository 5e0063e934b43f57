//! Parsing a connector's configuration, and its JSON schema: what every source, driver
//! and output shares with the pipeline file, so that all of them read, describe and
//! report alike. (Sources reach it as `sluice_source_sdk::config`.)
//!
//! - A configuration is strict (`#[serde(deny_unknown_fields)]` on the kind's type):
//!   a typo is an error, never silently ignored.
//! - An error names its place inside the kind's configuration ([`InvalidConfig`]); the
//!   runtime puts the kind's own place in front (`sources.views.file.path: ...`).
//! - Byte sizes are an integer or a string with a binary unit (`"16MiB"`), the same
//!   grammar everywhere in the pipeline file ([`parse_bytes`], [`de_bytes`]).
//! - Relative paths are relative to the pipeline file's folder ([`resolve_path`]).
//! - A configuration's JSON schema is derived from its type ([`schema_for`]): each
//!   field's doc comment is its description (what `sluice schema` and the docs'
//!   reference tables show, so it is written for the user), its serde default its
//!   `default`. Fields read specially say how with `#[schemars(schema_with = ...)]`
//!   ([`bytes_schema`], [`duration_schema`], [`nullable_string`]) and write their
//!   default as the user would with `#[serde(serialize_with = ...)]` ([`ser_bytes`],
//!   [`ser_duration`]; serde ignores it on a type that only deserializes).

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serializer};
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

/// Makes a relative `path` relative to the pipeline file's folder `base_dir`. A URL
/// (`s3://bucket/x`, `postgres://host/db`: a scheme, then `://`) is no path and is
/// left as it is.
pub fn resolve_path(path: &mut PathBuf, base_dir: &Path) {
    if path.is_relative() && !is_url(&path.to_string_lossy()) {
        *path = base_dir.join(&*path);
    }
}

/// Whether `text` starts with a URL scheme and `://`.
fn is_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        let mut chars = scheme.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
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

/// The JSON schema (draft 7) of a configuration type `C`, as `sluice schema` prints it,
/// the docs' reference tables show it and pipeline files are checked against it:
///
/// - subschemas are inlined (no `definitions`), so each key reads on its own;
/// - a description written over several doc-comment lines is one paragraph (schemars
///   keeps the line breaks of the comment);
/// - an enum whose values are documented one by one is one `enum` of them (the field
///   documents what each value means);
/// - an optional key whose default is "unset" shows no `default: null`.
///
/// An `Option<T>` field is absent-only in the schema when it says so with
/// `#[schemars(with = "T")]`; schemars would otherwise also allow `null`.
pub fn schema_for<C: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft07()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<C>().to_value();
    tidy(&mut schema);
    schema
}

/// The clean-ups of [`schema_for`], in every subschema.
fn tidy(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if let Some(Value::String(text)) = object.get_mut("description") {
                *text = one_paragraph_per_blank_line(text);
            }
            if object.get("default") == Some(&Value::Null) {
                object.remove("default");
            }
            if let Some(values) = object.get("oneOf").and_then(unit_values) {
                object.remove("oneOf");
                object.insert("type".into(), "string".into());
                object.insert("enum".into(), Value::Array(values));
            }
            object.values_mut().for_each(tidy);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// The lines of a doc comment joined into paragraphs (a blank line separates two).
fn one_paragraph_per_blank_line(text: &str) -> String {
    let paragraphs: Vec<String> = text
        .split("\n\n")
        .map(|paragraph| {
            let lines: Vec<&str> = paragraph.lines().map(str::trim).collect();
            lines.join(" ")
        })
        .filter(|paragraph| !paragraph.is_empty())
        .collect();
    paragraphs.join("\n\n")
}

/// The values of `oneOf` alternatives that are each one string (the unit variants of an
/// enum, which schemars lists one by one when they are documented); `None` if any
/// alternative is more than that.
fn unit_values(alternatives: &Value) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    for alternative in alternatives.as_array()? {
        let alternative = alternative.as_object()?;
        let only_metadata = |key: &String| {
            matches!(
                key.as_str(),
                "type" | "const" | "enum" | "description" | "title"
            )
        };
        if !alternative.keys().all(only_metadata)
            || alternative.get("type").is_some_and(|t| t != "string")
        {
            return None;
        }
        match (alternative.get("const"), alternative.get("enum")) {
            (Some(Value::String(value)), None) => values.push(value.as_str().into()),
            (None, Some(Value::Array(listed))) if listed.iter().all(Value::is_string) => {
                values.extend(listed.iter().cloned());
            }
            _ => return None,
        }
    }
    Some(values)
}

/// The schema of a byte count read by [`de_bytes`]: an integer, or a string like
/// `"64MiB"` (`#[schemars(schema_with = "bytes_schema")]`).
pub fn bytes_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["integer", "string"], "minimum": 0})
}

/// Writes a byte count as a user would: `"16MiB"` when it is a whole number of a unit,
/// else the integer. For a field's default in its schema
/// (`#[serde(serialize_with = "ser_bytes")]`).
pub fn ser_bytes<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
    let unit = [(30, "GiB"), (20, "MiB"), (10, "KiB")]
        .into_iter()
        .find(|&(shift, _)| *bytes != 0 && bytes.is_multiple_of(1 << shift));
    match unit {
        Some((shift, unit)) => s.serialize_str(&format!("{}{unit}", bytes >> shift)),
        None => s.serialize_u64(*bytes),
    }
}

/// The schema of a duration read by [`de_duration`]: a string like `"250ms"`
/// (`#[schemars(schema_with = "duration_schema")]`).
pub fn duration_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string"})
}

/// Writes a duration as a user would: in the largest of `h`, `m`, `s`, `ms` it is a
/// whole number of (`"10m"`, `"250ms"`). For a field's default in its schema
/// (`#[serde(serialize_with = "ser_duration")]`).
pub fn ser_duration<S: Serializer>(duration: &Duration, s: S) -> Result<S::Ok, S::Error> {
    let millis = duration.as_millis();
    let text = [(3_600_000, "h"), (60_000, "m"), (1_000, "s")]
        .into_iter()
        .find(|&(unit, _)| millis != 0 && millis.is_multiple_of(unit))
        .map(|(unit, name)| format!("{}{name}", millis / unit))
        .unwrap_or_else(|| format!("{millis}ms"));
    s.serialize_str(&text)
}

/// The schema of an optional string that may also be written `null`, which means
/// something else than leaving the key out (`meta: null`: no metadata)
/// (`#[schemars(schema_with = "nullable_string")]`).
pub fn nullable_string(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["string", "null"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_path_joins_the_pipeline_folder_and_a_url_stays_as_it_is() {
        let resolved = |text: &str| {
            let mut path = PathBuf::from(text);
            resolve_path(&mut path, Path::new("/pipelines"));
            path.to_string_lossy().into_owned()
        };
        assert_eq!(resolved("out/db"), "/pipelines/out/db");
        assert_eq!(resolved("/var/out"), "/var/out");
        assert_eq!(resolved("s3://bucket/x"), "s3://bucket/x");
        assert_eq!(resolved("postgres://h/db"), "postgres://h/db");
        // Not a scheme: a folder named so.
        assert_eq!(resolved("a b://c"), "/pipelines/a b://c");
    }

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

    /// A configuration as a source would write it: a byte size, a duration, an enum
    /// documented value by value, an optional key, a nullable one.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[schemars(title = "Example")]
    #[allow(dead_code)]
    struct Example {
        /// The size, over
        /// two lines.
        ///
        /// A second paragraph.
        #[serde(
            default = "sixteen_mib",
            deserialize_with = "de_bytes",
            serialize_with = "ser_bytes"
        )]
        #[schemars(schema_with = "bytes_schema")]
        size: u64,
        /// How long.
        #[serde(
            default = "ten_minutes",
            deserialize_with = "de_duration",
            serialize_with = "ser_duration"
        )]
        #[schemars(schema_with = "duration_schema")]
        wait: Duration,
        /// Which one.
        format: Format,
        /// Left out: none.
        #[schemars(with = "String")]
        #[serde(default)]
        name: Option<String>,
        /// `null`: none.
        #[serde(default)]
        #[schemars(schema_with = "nullable_string")]
        meta: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Format {
        /// One.
        Json,
        /// Two.
        Csv,
    }

    fn sixteen_mib() -> u64 {
        16 << 20
    }

    fn ten_minutes() -> Duration {
        Duration::from_secs(600)
    }

    #[test]
    fn a_derived_schema_reads_as_a_written_one() {
        let schema = schema_for::<Example>();
        assert_eq!(
            schema,
            serde_json::json!({
                "$schema": "http://json-schema.org/draft-07/schema#",
                "title": "Example",
                "description": "A configuration as a source would write it: a byte size, a \
                    duration, an enum documented value by value, an optional key, a nullable one.",
                "type": "object",
                "additionalProperties": false,
                "required": ["format"],
                "properties": {
                    "size": {
                        "type": ["integer", "string"], "minimum": 0, "default": "16MiB",
                        "description": "The size, over two lines.\n\nA second paragraph."
                    },
                    "wait": {"type": "string", "default": "10m", "description": "How long."},
                    "format": {"type": "string", "enum": ["json", "csv"], "description": "Which one."},
                    "name": {"type": "string", "description": "Left out: none."},
                    "meta": {"type": ["string", "null"], "description": "`null`: none."},
                }
            })
        );
    }

    #[test]
    fn defaults_are_written_in_the_largest_whole_unit() {
        let bytes = |n: u64| ser_bytes(&n, serde_json::value::Serializer).unwrap();
        assert_eq!(bytes(16 << 20), "16MiB");
        assert_eq!(bytes(1 << 30), "1GiB");
        assert_eq!(bytes(3 << 10), "3KiB");
        assert_eq!(bytes(1536), 1536);
        assert_eq!(bytes(0), 0);
        let duration = |d: Duration| ser_duration(&d, serde_json::value::Serializer).unwrap();
        assert_eq!(duration(Duration::from_millis(10)), "10ms");
        assert_eq!(duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration(Duration::from_secs(30)), "30s");
        assert_eq!(duration(Duration::from_secs(600)), "10m");
        assert_eq!(duration(Duration::from_secs(7200)), "2h");
    }
}
