//! What the user writes: `files: {directory, s3?}` and per binding `{path}`.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
use sluice_object_store::S3Settings;
pub use sluice_output_sdk::config::parse;

/// JSON schema of [`Config`] (what Spec returns and `sluice schema` prints).
pub fn endpoint_schema() -> String {
    schema_for::<Config>().to_string()
}

/// JSON schema of [`Resource`]'s keys; the output SDK adds the encoding keys.
pub fn resource_schema() -> String {
    schema_for::<Resource>().to_string()
}

/// One file per transaction and binding, under a folder or an S3 prefix.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Files endpoint")]
pub struct Config {
    /// The folder bindings write under (relative to the pipeline file), or
    /// s3://bucket/prefix on an S3 or S3-compatible store (see s3)
    #[schemars(length(min = 1))]
    pub directory: String,
    /// How to reach the store of an s3:// directory: endpoint, region, credentials,
    /// path-style access; what is left out comes from the environment (AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL)
    #[serde(default)]
    pub s3: Option<S3Settings>,
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
                json!({"directory": "s3://bkt/out", "s3": {"endpoint": "http://127.0.0.1:9000",
                       "path_style": true}}),
            ],
            &[
                json!({"directory": "out", "dir": "x"}),
                json!({"directory": "out", "max_buffer_size_bytes": 0}),
                json!({}),
                json!({"directory": "s3://bkt/out", "s3": {"bucket": "x"}}),
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
