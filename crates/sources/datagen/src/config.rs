//! What the user writes: `datagen: {seed: 7, documents: 1000000, keys: 100000}`, every
//! key optional. Strict: unknown keys are errors.

use serde::Deserialize;
use sluice_source_sdk::InvalidConfig;

/// JSON schema of [`DatagenConfig`] (what `sluice schema datagen` prints).
pub const SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Generated documents",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "seed": {"type": "integer", "minimum": 0, "default": 0, "description": "Seeds the generator: the same seed, keys and shape give the same documents."},
    "documents": {"type": "integer", "minimum": 0, "description": "How many documents to generate; unset for an endless stream."},
    "keys": {"type": "integer", "minimum": 1, "default": 1000, "description": "How many distinct keys the documents spread over."},
    "rate": {"type": "number", "exclusiveMinimum": 0, "description": "Documents per second; unset for as fast as possible."},
    "shape": {"type": "string", "enum": ["pageviews"], "default": "pageviews", "description": "The documents' shape: pageviews are {user_id, views, bytes, last_seen, tags}."}
  }
}"#;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatagenConfig {
    #[serde(default)]
    pub seed: u64,
    /// How many documents; unset for an endless stream.
    #[serde(default)]
    pub documents: Option<u64>,
    /// How many distinct keys (key cardinality).
    #[serde(default = "default_keys")]
    pub keys: u64,
    /// Documents per second; unset for as fast as possible.
    #[serde(default)]
    pub rate: Option<f64>,
    #[serde(default)]
    pub shape: DatagenShape,
}

fn default_keys() -> u64 {
    1000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatagenShape {
    #[default]
    Pageviews,
}

impl DatagenConfig {
    /// What serde cannot check; errors name the key inside `datagen`.
    pub fn check(&self) -> Result<(), InvalidConfig> {
        if self.keys == 0 {
            return Err(InvalidConfig::new("keys", "must be at least 1"));
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(InvalidConfig::new(
                "rate",
                "must be a positive number of documents per second",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_rate_are_checked() {
        let config = |keys, rate| DatagenConfig {
            seed: 0,
            documents: None,
            keys,
            rate,
            shape: DatagenShape::Pageviews,
        };
        for (keys, rate, error) in [
            (1, None, None),
            (10, Some(0.5), None),
            (0, None, Some("keys: must be at least 1")),
            (1, Some(0.0), Some("rate: must be a positive number")),
            (1, Some(-3.0), Some("rate: must be a positive number")),
            (1, Some(f64::NAN), Some("rate: must be a positive number")),
            (
                1,
                Some(f64::INFINITY),
                Some("rate: must be a positive number"),
            ),
        ] {
            let checked = config(keys, rate).check().map_err(|e| e.to_string());
            match error {
                None => assert_eq!(checked, Ok(()), "{keys} {rate:?}"),
                Some(prefix) => assert!(
                    checked.as_ref().is_err_and(|e| e.starts_with(prefix)),
                    "{keys} {rate:?}: {checked:?}"
                ),
            }
        }
    }
}
