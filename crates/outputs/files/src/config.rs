//! What the user writes: `files: {directory}` and per binding `{path}`.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
pub use sluice_output_sdk::config::parse;
use std::path::PathBuf;

/// JSON schema of [`Config`] (what Spec returns and `sluice schema` prints).
pub fn endpoint_schema() -> String {
    schema_for::<Config>().to_string()
}

/// JSON schema of [`Resource`]'s keys; the output SDK adds the encoding keys.
pub fn resource_schema() -> String {
    schema_for::<Resource>().to_string()
}

/// One file per transaction and binding, under a folder.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Files endpoint")]
pub struct Config {
    /// The folder bindings write under (relative to the pipeline file)
    pub directory: PathBuf,
    /// Bytes of encoded changes buffered before they are written
    #[serde(default = "default_buffer")]
    #[schemars(range(min = 1))]
    pub max_buffer_size_bytes: usize,
}

fn default_buffer() -> usize {
    1 << 20
}

/// A binding's folder.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Files binding")]
pub struct Resource {
    /// The binding's folder, under the endpoint's directory
    pub path: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&endpoint_schema()).unwrap();
        assert_schema_judges(
            &endpoint,
            &[
                json!({"directory": "out"}),
                json!({"directory": "/var/out", "max_buffer_size_bytes": 4096}),
            ],
            &[
                json!({"directory": "out", "dir": "x"}),
                json!({"directory": "out", "max_buffer_size_bytes": 0}),
                json!({}),
            ],
        );
        let resource = sluice_output_sdk::resource_schema(&crate::kind());
        let resource: Value = serde_json::from_str(&resource).unwrap();
        assert_schema_judges(
            &resource,
            &[
                json!({"path": "views"}),
                json!({"path": "views", "format": "csv", "snapshot": true}),
            ],
            &[
                json!({"path": "views", "topic": "t"}),
                json!({"format": "json"}),
            ],
        );
    }
}
