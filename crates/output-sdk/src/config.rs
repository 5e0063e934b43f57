//! Strict parsing of what the user writes for an output kind: unknown keys are errors,
//! and every error names its place (`topic: invalid type: …`); and the split of an
//! endpoint's configuration into its kind's keys and the SDK's own `view`.

use crate::OutputError;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_pg_client::EndpointConfig;

/// Parses `value` strictly, the error naming the place.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, OutputError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        OutputError::Config(if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        })
    })
}

/// An output endpoint's configuration, split: the keys of its kind, which the kind
/// parses strictly, and `view`, which the SDK takes out first (as a resource's encoding
/// keys): where the output keeps its view.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The configuration without `view`: what the kind's `check` and `endpoint` see.
    pub kind: Value,
    /// The PostgreSQL schema holding the view; `None`: beside the local recovery log.
    pub view: Option<EndpointConfig>,
}

impl Endpoint {
    /// Splits `config`, parsing `view` strictly (errors name `view: …`).
    pub fn parse(config: &Value) -> Result<Endpoint, OutputError> {
        let mut kind = config.clone();
        let view = match kind
            .as_object_mut()
            .and_then(|fields| fields.remove("view"))
        {
            None => None,
            Some(view) => Some(EndpointConfig::parse(&view.to_string()).map_err(|err| {
                // The client names the place as a driver's endpoint; here it is `view`.
                let message = match err {
                    sluice_driver_sdk::Error::Config(message) => message,
                    other => other.to_string(),
                };
                let place = message
                    .strip_prefix("endpoint config: ")
                    .unwrap_or(&message);
                OutputError::Config(format!("view: {place}"))
            })?),
        };
        Ok(Endpoint { kind, view })
    }
}
