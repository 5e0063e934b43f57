//! What the user writes: the endpoint (`{"url": "postgres://...", "schema": "sales"}`,
//! [`EndpointConfig`], shared with the output SDK's view in `sluice-pg-client` and
//! re-exported here) and each binding's resource (`{"table": "pageviews"}`), with the
//! JSON schemas that Spec returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`resource config: table: ...`), so a pipeline author can find it in
//! their file.

use sluice_pg_client::NAME_LIMIT;
use sluice_sqlkit::config::{TableResource, table_resource_schema};

pub use sluice_pg_client::EndpointConfig;

/// Where the documentation of this driver lives (returned by Spec).
pub const DOCUMENTATION_URL: &str =
    "https://github.com/sluice-rs/sluice/tree/main/crates/connectors/postgres";

/// JSON schema of [`ResourceConfig`].
pub fn resource_schema() -> String {
    table_resource_schema("PostgreSQL table", Some(NAME_LIMIT.max))
}

/// One binding's resource: a table, parsed with [`ResourceConfig::parse`]`(json, Some(NAME_LIMIT))`.
pub type ResourceConfig = TableResource;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn table_names_may_have_63_bytes() {
        let table = |name: String| {
            ResourceConfig::parse(&format!(r#"{{"table": "{name}"}}"#), Some(NAME_LIMIT))
        };
        assert!(table("x".repeat(63)).is_ok());
        let err = table("é".repeat(32)).unwrap_err();
        assert!(
            err.to_string()
                .contains("is longer than the 63 bytes PostgreSQL allows"),
            "{err}"
        );
    }

    #[test]
    fn the_resource_schema_takes_63_bytes_and_refuses_an_unknown_key() {
        let resource: Value = serde_json::from_str(&resource_schema()).unwrap();
        assert_schema_judges(
            &resource,
            &[json!({"table": "x".repeat(63)})],
            &[
                json!({"table": "x".repeat(64)}),
                json!({"table": "t", "tabel": "t"}),
            ],
        );
    }
}
