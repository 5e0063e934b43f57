//! The tests of conditional `reduce` annotations: subschemas a right-hand value is
//! validated against to pick the strategy at its location (see `reduce/build.rs`).
//!
//! All of one schema's tests come from one [`jsonschema::ValidatorMap`] of the whole
//! collection schema, compiled with [`super::validator_options`]: each test is read in the
//! schema's own dialect, and a `$ref` inside it resolves against the root as it does for
//! the document's own validation. Tests read the compact [`Doc`] directly.

use super::SchemaError;
use super::instance::CompactJson;
use crate::compact::Doc;
use serde_json::Value;
use std::sync::Arc;

/// One subschema, by its location in the root (`#/properties/a/if`).
#[derive(Clone)]
pub(crate) struct Test {
    map: Arc<jsonschema::ValidatorMap<CompactJson>>,
    location: String,
}

impl std::fmt::Debug for Test {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Test({})", self.location)
    }
}

impl Test {
    /// Whether `value` validates against this subschema.
    pub(crate) fn admits(&self, value: &Doc) -> bool {
        // The location was found in the map when the test was compiled.
        self.map
            .get(&self.location)
            .is_some_and(|validator| validator.is_valid(value))
    }
}

/// Compiles the subschemas of `root` at `locations` (each `#` or `#/...`).
pub(crate) fn compile(root: &Value, locations: &[String]) -> Result<Vec<Test>, SchemaError> {
    if locations.is_empty() {
        return Ok(Vec::new());
    }
    let map = super::validator_options(root)
        .build_map(root)
        .map_err(|err| SchemaError::Invalid(err.to_string()))?;
    let map = Arc::new(map);
    locations
        .iter()
        .map(|location| match map.contains_key(location) {
            true => Ok(Test {
                map: Arc::clone(&map),
                location: location.clone(),
            }),
            false => Err(SchemaError::Reduce {
                location: location.clone(),
                reason: "this conditional subschema does not compile on its own".to_string(),
            }),
        })
        .collect()
}
