//! [`MysqlDriver`]: the unary calls (Spec, Validate, Apply) and Open.
//!
//! Apply ([`sluice_sqlkit::apply`]) compares the spec with the catalog of the
//! endpoint's database and runs only what is missing, in order:
//!
//! ```text
//!   CREATE TABLE IF NOT EXISTS `sluice_checkpoints` (…)                  (table missing)
//!   CREATE TABLE IF NOT EXISTS `t` (`c` … COMMENT '…', PRIMARY KEY …)   (table missing)
//!   ALTER TABLE `t` ADD COLUMN `new` BIGINT COMMENT '…'                  (newly selected field)
//! ```
//!
//! Re-applying the same spec therefore runs nothing, and a dry run returns exactly the
//! statements a real apply would run at that moment. DDL is not transactional in
//! MariaDB or MySQL (each statement commits on its own), but every statement is
//! idempotent, so an apply that failed half-way is finished by running it again.

use crate::client::{self, My};
use crate::config::{
    DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, NAME_LIMIT, resource_schema,
};
use crate::sql::{self, ColumnType};
use crate::transactor::MysqlTransactor;
use async_trait::async_trait;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Declared, Driver, Result, Transactor};
use sluice_sqlkit as kit;
use sluice_sqlkit::apply::{Action, spec_response, validate_tables};
use sluice_sqlkit::config::materialization;

/// The MariaDB/MySQL driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct MysqlDriver;

impl MysqlDriver {
    pub fn new() -> Self {
        MysqlDriver
    }
}

/// Applies (or, dry, only describes) what the plan of `action` decides from the
/// current catalog, statement by statement.
async fn apply(req: m::ApplyRequest, action: Action) -> Result<m::ApplyResponse> {
    let spec = materialization(req.materialization)?;
    let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
    let tables = sql::spec_tables(&spec)?;
    let (mut conn, flavor) = client::connect(&endpoint).await?;
    let server = endpoint.describe();
    let mut catalog = My {
        conn: &mut conn,
        flavor,
        server: &server,
    };
    kit::apply::apply(
        &mut catalog,
        &sql::Ddl { flavor },
        &tables,
        kit::apply::Target::new(&spec, &req.version, req.last_materialization.as_ref()),
        action,
        req.dry_run,
    )
    .await
}

#[async_trait]
impl Driver for MysqlDriver {
    fn declared(&self) -> Declared {
        Declared::AUTHORITATIVE_TABLE
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(spec_response(
            &ENDPOINT_SCHEMA,
            resource_schema(),
            DOCUMENTATION_URL,
        ))
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        let endpoint = EndpointConfig::parse(&req.endpoint_spec_json)?;
        validate_tables::<ColumnType>(&req, Some(NAME_LIMIT), |table| {
            vec![endpoint.database(), table]
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Upsert).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Delete).await
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let (transactor, flow_checkpoint) = MysqlTransactor::open(open).await?;
        Ok((Box::new(transactor), Opened { flow_checkpoint }))
    }
}
