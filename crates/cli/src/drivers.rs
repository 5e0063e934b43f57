//! The drivers built into this binary, by the name pipeline files and `sluice driver`
//! commands use (the driver kinds of [`sluice_app::registry`] that run in-process), and
//! serving one with a default configuration.

use async_trait::async_trait;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Declared, Driver, Result, Transactor};
use std::sync::Arc;

/// Names of the built-in drivers, sorted, for help texts and errors.
pub fn builtin_names() -> Vec<&'static str> {
    sluice_app::registry().builtin_driver_names()
}

/// A fresh instance of the built-in driver `name`.
pub fn builtin(name: &str) -> Option<Arc<dyn Driver>> {
    sluice_app::registry().driver(name)?.driver()
}

/// A driver whose requests carry `config` as their endpoint configuration when they carry
/// none (`sluice driver serve --config`): the served driver then needs no configuration
/// from its clients, e.g. the SQLite file it writes to.
pub struct WithDefaultConfig {
    driver: Arc<dyn Driver>,
    config: String,
}

impl WithDefaultConfig {
    pub fn new(driver: Arc<dyn Driver>, config: serde_json::Value) -> Self {
        WithDefaultConfig {
            driver,
            config: config.to_string(),
        }
    }

    fn fill(&self, endpoint_spec_json: &mut String) {
        if endpoint_spec_json.trim().is_empty() {
            endpoint_spec_json.clone_from(&self.config);
        }
    }

    fn fill_spec(&self, spec: &mut Option<flow::MaterializationSpec>) {
        self.fill(&mut spec.get_or_insert_with(Default::default).endpoint_spec_json);
    }
}

#[async_trait]
impl Driver for WithDefaultConfig {
    fn declared(&self) -> Declared {
        self.driver.declared()
    }

    async fn spec(&self, mut req: m::SpecRequest) -> Result<m::SpecResponse> {
        self.fill(&mut req.endpoint_spec_json);
        self.driver.spec(req).await
    }
    async fn validate(&self, mut req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.fill(&mut req.endpoint_spec_json);
        self.driver.validate(req).await
    }
    async fn apply_upsert(&self, mut req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.fill_spec(&mut req.materialization);
        self.driver.apply_upsert(req).await
    }
    async fn apply_delete(&self, mut req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.fill_spec(&mut req.materialization);
        self.driver.apply_delete(req).await
    }
    async fn open(&self, mut open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        self.fill_spec(&mut open.materialization);
        self.driver.open(open).await
    }
}
