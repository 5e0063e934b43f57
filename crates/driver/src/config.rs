//! Reading what a request carries: the user's JSON configuration, strictly, and the
//! materialization spec.
//!
//! Every driver's endpoint and resource configurations go through [`parse`], so every
//! driver reports a wrong field the same way: `endpoint config: url: invalid type ...`,
//! naming the path of the field (serde_path_to_error) so a pipeline author can find it
//! in their file. Unknown properties are refused by the config types themselves
//! (`#[serde(deny_unknown_fields)]`).

use crate::{Error, Result};
use serde::de::DeserializeOwned;
use sluice_proto::flow;

/// Deserializes `json` as `what` (e.g. "resource config"); an error is
/// [`Error::Config`] naming `what` and the path of the offending field, if any.
pub fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            Error::Config(format!("{what}: {inner}"))
        } else {
            Error::Config(format!("{what}: {path}: {inner}"))
        }
    })
}

/// The materialization spec of an Apply or Open request, which must carry one.
pub fn materialization(
    spec: Option<flow::MaterializationSpec>,
) -> Result<flow::MaterializationSpec> {
    spec.ok_or_else(|| Error::Config("request has no materialization spec".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // Read only by serde.
    struct Resource {
        table: String,
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        depth: u32,
    }

    fn error(json: &str) -> String {
        parse::<Resource>("resource config", json)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_wrong_field_is_named_by_its_path() {
        assert_eq!(
            error(r#"{"table": 5}"#),
            "invalid configuration: resource config: table: \
             invalid type: integer `5`, expected a string at line 1 column 11"
        );
        assert!(
            error(r#"{"table": "t", "nested": {"depth": "deep"}}"#)
                .contains("resource config: nested.depth: invalid type"),
        );
    }

    #[test]
    fn a_missing_or_unknown_field_names_the_config() {
        assert!(error("{}").contains("resource config: missing field `table`"));
        assert!(error(r#"{"table": "t", "tabel": "u"}"#).contains("unknown field `tabel`"));
    }

    #[test]
    fn a_request_without_a_spec_is_a_config_error() {
        let err = materialization(None).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(materialization(Some(Default::default())).is_ok());
    }
}
