//! [`SqliteDriver`]: the unary calls (Spec, Validate, Apply) and Open.
//!
//! Apply ([`sluice_sqlkit::apply`]) compares the spec with the database and runs only
//! what is missing, in one transaction:
//!
//! ```text
//!   CREATE TABLE IF NOT EXISTS "sluice_checkpoints" (…)          (table missing)
//!   CREATE TABLE IF NOT EXISTS "t" (…, PRIMARY KEY (…)) WITHOUT ROWID (table missing)
//!   ALTER TABLE "t" ADD COLUMN "new" INTEGER                     (newly selected field)
//! ```
//!
//! A dry run opens the database read-only, and never creates it: against a missing
//! file it plans from an empty catalog, so it describes everything a real apply would
//! create.

use crate::client::{Conn, Lite};
use crate::config::{DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, resource_schema};
use crate::sql::{self, ColumnType};
use crate::transactor::SqliteTransactor;
use async_trait::async_trait;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Declared, Driver, Result, Transactor};
use sluice_sqlkit as kit;
use sluice_sqlkit::apply::{Action, Catalog, Empty, spec_response, validate_tables};
use sluice_sqlkit::config::materialization;

/// The SQLite driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct SqliteDriver;

impl SqliteDriver {
    pub fn new() -> Self {
        SqliteDriver
    }
}

/// Applies (or, dry, only describes) what the plan of `action` decides from the
/// current database.
async fn apply(req: m::ApplyRequest, action: Action) -> Result<m::ApplyResponse> {
    let spec = materialization(req.materialization)?;
    let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
    let tables = sql::spec_tables(&spec)?;
    let conn = if req.dry_run {
        Conn::open_read_only(&endpoint.path).await?
    } else {
        Some(Conn::open(&endpoint.path).await?)
    };
    let catalog: &mut dyn Catalog = match &conn {
        Some(conn) => &mut Lite(conn),
        None => &mut Empty,
    };
    kit::apply::apply(
        catalog,
        &sql::Ddl,
        &tables,
        kit::apply::Target::new(&spec, &req.version, req.last_materialization.as_ref()),
        action,
        req.dry_run,
    )
    .await
}

#[async_trait]
impl Driver for SqliteDriver {
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
        EndpointConfig::parse(&req.endpoint_spec_json)?;
        validate_tables::<ColumnType>(&req, None, |table| vec![table])
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Upsert).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Delete).await
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let (transactor, flow_checkpoint) = SqliteTransactor::open(open).await?;
        Ok((Box::new(transactor), Opened { flow_checkpoint }))
    }
}
