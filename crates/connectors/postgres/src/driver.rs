//! [`PostgresDriver`]: the unary calls (Spec, Validate, Apply) and Open.
//!
//! Apply ([`sluice_sqlkit::apply`]) compares the spec with the catalog and runs only
//! what is missing, in one transaction (PostgreSQL's DDL is transactional, so a failed
//! apply leaves nothing half-done):
//!
//! ```text
//!   CREATE SCHEMA IF NOT EXISTS "s"                         (schema missing)
//!   CREATE TABLE IF NOT EXISTS "s"."sluice_checkpoints" …   (table missing)
//!   CREATE TABLE IF NOT EXISTS "s"."t" (…, PRIMARY KEY …)   (table missing)
//!   COMMENT ON COLUMN "s"."t"."c" IS 'Materialized by Sluice from /c of acme/x'
//!   ALTER TABLE "s"."t" ADD COLUMN "new" bigint             (newly selected field)
//! ```
//!
//! Re-applying the same spec therefore runs nothing, and a dry run returns exactly the
//! statements a real apply would run at that moment. A delete drops the bindings'
//! tables and the materialization's checkpoints, then what Apply made for it alone:
//! the checkpoints table once no other materialization has a row there, then the schema
//! once it holds nothing else (never `public`).

use crate::client::Pg;
use crate::config::{DOCUMENTATION_URL, resource_schema};
use crate::sql::{self, ColumnType};
use crate::transactor::PostgresTransactor;
use async_trait::async_trait;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Declared, Driver, Result, Transactor};
use sluice_pg_client::{ENDPOINT_SCHEMA, EndpointConfig, NAME_LIMIT};
use sluice_sqlkit as kit;
use sluice_sqlkit::apply::{Action, spec_response, validate_tables};
use sluice_sqlkit::config::materialization;

/// The PostgreSQL driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct PostgresDriver;

impl PostgresDriver {
    pub fn new() -> Self {
        PostgresDriver
    }
}

/// Applies (or, dry, only describes) what the plan of `action` decides from the
/// current catalog, in one transaction.
async fn apply(req: m::ApplyRequest, action: Action) -> Result<m::ApplyResponse> {
    let spec = materialization(req.materialization)?;
    let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
    let tables = sql::spec_tables(&endpoint, &spec)?;
    let client = sluice_pg_client::connect(&endpoint).await?;
    let server = endpoint.describe();
    let schema = endpoint.schema();
    let mut catalog = Pg {
        client: &client,
        schema,
        server: &server,
    };
    let ddl = sql::Ddl { schema };
    kit::apply::apply(
        &mut catalog,
        &ddl,
        &tables,
        kit::apply::Target::new(&spec, &req.version, req.last_materialization.as_ref()),
        action,
        req.dry_run,
    )
    .await
}

#[async_trait]
impl Driver for PostgresDriver {
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
            vec![endpoint.schema().to_owned(), table]
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Upsert).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, Action::Delete).await
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let (transactor, flow_checkpoint) = PostgresTransactor::open(open).await?;
        Ok((Box::new(transactor), Opened { flow_checkpoint }))
    }
}
