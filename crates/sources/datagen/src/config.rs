//! What the user writes: `datagen: {seed: 7, documents: 1000000, keys: 100000}`, every
//! key optional. Strict: unknown keys are errors.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_source_sdk::InvalidConfig;

/// Generated documents, the same for the same seed, keys and shape.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Generated documents")]
pub struct DatagenConfig {
    /// Seeds the generator: the same seed, keys and shape give the same documents.
    #[serde(default)]
    pub seed: u64,
    /// How many documents to generate; unset for an endless stream.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub documents: Option<u64>,
    /// How many distinct keys the documents spread over.
    #[serde(default = "default_keys")]
    #[schemars(range(min = 1))]
    pub keys: u64,
    /// Documents per second; unset for as fast as possible.
    #[serde(default)]
    #[schemars(with = "f64", extend("exclusiveMinimum" = 0))]
    pub rate: Option<f64>,
    /// The documents' shape: pageviews are {user_id, views, bytes, last_seen, tags}.
    #[serde(default)]
    pub shape: DatagenShape,
}

fn default_keys() -> u64 {
    1000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
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
    use serde_json::json;
    use sluice_source_sdk::config::schema_for;
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        assert_schema_judges(
            &schema_for::<DatagenConfig>(),
            &[
                json!({}),
                json!({"seed": 7, "documents": 1000000, "keys": 100000}),
                json!({"rate": 0.5, "shape": "pageviews"}),
            ],
            &[
                json!({"seed": 7, "count": 10}),
                json!({"keys": 0}),
                json!({"rate": 0}),
                json!({"shape": "orders"}),
            ],
        );
    }

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
