//! [`PostgresDriver`]: the unary calls (Spec, Validate, Apply) and Open.
//!
//! Apply compares the spec with the catalog and runs only what is missing, in one
//! transaction (PostgreSQL's DDL is transactional, so a failed apply leaves nothing
//! half-done):
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
//! statements a real apply would run at that moment.

use crate::client::{self, pg_error};
use crate::config::{
    DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, NAME_LIMIT, ResourceConfig, resource_schema,
};
use crate::sql::{self, CHECKPOINTS_TABLE, ColumnType, Table};
use crate::transactor::PostgresTransactor;
use async_trait::async_trait;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Driver, Result, Transactor};
use sluice_sqlkit as kit;
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::validate;
use tokio_postgres::Client;

/// The PostgreSQL driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct PostgresDriver;

impl PostgresDriver {
    pub fn new() -> Self {
        PostgresDriver
    }
}

/// The tables of a materialization's bindings, each named once.
pub(crate) fn spec_tables(
    endpoint: &EndpointConfig,
    spec: &flow::MaterializationSpec,
) -> Result<Vec<Table>> {
    let tables = kit::spec_tables(spec, Some(NAME_LIMIT), |a, b| a == b)?;
    let schema = endpoint.schema();
    Ok((tables.into_iter())
        .map(|table| Table {
            schema: schema.to_owned(),
            table,
        })
        .collect())
}

/// Which Apply call is being served.
#[derive(Debug, Clone, Copy)]
enum Action {
    Upsert,
    Delete,
}

/// Applies (or, dry, only describes) what the plan of `action` decides from the
/// current catalog.
async fn apply(req: m::ApplyRequest, action: Action) -> Result<m::ApplyResponse> {
    let spec = materialization(req.materialization)?;
    let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
    let mut client = client::connect(&endpoint).await?;
    let statements = match action {
        Action::Upsert => plan_upsert(&client, &endpoint, &spec).await?,
        Action::Delete => plan_delete(&client, &endpoint, &spec).await?,
    };
    if !req.dry_run && !statements.is_empty() {
        let server = endpoint.describe();
        let tx = client
            .transaction()
            .await
            .map_err(|err| pg_error(format!("beginning apply on {server}"), err))?;
        for statement in &statements {
            tx.batch_execute(statement)
                .await
                .map_err(|err| pg_error(format!("applying `{statement}`"), err))?;
        }
        tx.commit()
            .await
            .map_err(|err| pg_error(format!("committing apply on {server}"), err))?;
    }
    Ok(m::ApplyResponse {
        action_description: statements.iter().map(|s| format!("{s};\n")).collect(),
    })
}

/// Creates the schema, the checkpoints table and missing tables; adds missing columns.
async fn plan_upsert(
    client: &Client,
    endpoint: &EndpointConfig,
    spec: &flow::MaterializationSpec,
) -> Result<Vec<String>> {
    let schema = endpoint.schema();
    let mut statements = Vec::new();
    if !client::schema_exists(client, schema).await? {
        statements.push(format!(
            "CREATE SCHEMA IF NOT EXISTS {}",
            sql::quote_ident(schema)
        ));
    }
    if client::existing_columns(client, schema, CHECKPOINTS_TABLE)
        .await?
        .is_empty()
    {
        statements.push(sql::create_checkpoints_sql(schema));
    }
    for table in spec_tables(endpoint, spec)? {
        let existing = client::existing_columns(client, schema, &table.name).await?;
        let missing = if existing.is_empty() {
            statements.push(table.create_sql());
            table.columns.iter().collect::<Vec<_>>()
        } else {
            let missing: Vec<_> = (table.columns.iter())
                .filter(|c| !existing.contains(&c.field))
                .collect();
            statements.extend(missing.iter().map(|c| table.add_column_sql(c)));
            missing
        };
        statements.extend(missing.iter().map(|c| table.comment_sql(c)));
    }
    Ok(statements)
}

/// Drops the tables of existing bindings and forgets the materialization's checkpoints.
async fn plan_delete(
    client: &Client,
    endpoint: &EndpointConfig,
    spec: &flow::MaterializationSpec,
) -> Result<Vec<String>> {
    let schema = endpoint.schema();
    let mut statements = Vec::new();
    for table in spec_tables(endpoint, spec)? {
        if !client::existing_columns(client, schema, &table.name)
            .await?
            .is_empty()
        {
            statements.push(table.drop_sql());
        }
    }
    let has_checkpoints = !client::existing_columns(client, schema, CHECKPOINTS_TABLE)
        .await?
        .is_empty();
    if has_checkpoints && client::checkpoint_rows(client, schema, &spec.materialization).await? > 0
    {
        statements.push(format!(
            "DELETE FROM {} WHERE \"materialization\" = {}",
            sql::qualify(schema, CHECKPOINTS_TABLE),
            sql::quote_literal(&spec.materialization)
        ));
    }
    Ok(statements)
}

#[async_trait]
impl Driver for PostgresDriver {
    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: ENDPOINT_SCHEMA.to_owned(),
            resource_spec_schema_json: resource_schema(),
            documentation_url: DOCUMENTATION_URL.to_owned(),
        })
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        let endpoint = EndpointConfig::parse(&req.endpoint_spec_json)?;
        validate::validate(&validate::Store::of::<ColumnType>(), &req, |json| {
            let resource = ResourceConfig::parse(json, Some(NAME_LIMIT))?;
            Ok(validate::Resource {
                path: vec![endpoint.schema().to_owned(), resource.table],
                delta_updates: resource.delta_updates,
            })
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
