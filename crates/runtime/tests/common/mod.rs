//! What the runtime's pipeline tests share: the in-process memory driver, as the
//! registry lists it and as an endpoint a test keeps to read the store afterwards.

// Each test binary uses its own part of this.
#![allow(dead_code)]

use async_trait::async_trait;
use serde_json::json;
use sluice_driver_sdk::Builtin;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::{CommitPattern, flow};
use sluice_memory::MemoryDriver;
use sluice_memory::config::EndpointConfig;
use sluice_runtime::config::EndpointDef;
use sluice_runtime::pipeline::{Connect, Connected};
use std::path::Path;
use std::sync::Arc;

/// The `memory:` endpoint kind, as a binary registers it.
pub fn memory_kind() -> Builtin {
    Builtin::new::<EndpointConfig>(
        "memory",
        flow::EndpointType::SluiceMemory,
        &["path"],
        || Arc::new(MemoryDriver::new()),
    )
}

/// Connects every materialization to the one in-process endpoint the test holds.
pub struct Connector(pub Arc<InProcess>);

#[async_trait]
impl Connect for Connector {
    async fn connect(
        &self,
        _materialization: &str,
        _state_dir: &Path,
        _endpoint: &EndpointDef,
    ) -> Result<Connected, String> {
        Ok(Connected::flow(
            self.0.clone(),
            flow::EndpointType::SluiceMemory,
            json!({}),
            Some(CommitPattern::RemoteAuthoritative),
        ))
    }
}
