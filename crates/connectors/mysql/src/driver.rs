//! [`MysqlDriver`]: the unary calls (Spec, Validate, Apply) and Open.
//!
//! Apply compares the spec with the catalog of the endpoint's database and runs only
//! what is missing, in order:
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

use crate::client;
use crate::config::{
    DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, NAME_LIMIT, ResourceConfig, resource_schema,
};
use crate::sql::{self, CHECKPOINTS_TABLE, ColumnType, Table};
use crate::transactor::MysqlTransactor;
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::{Driver, Result, Transactor};
use sluice_sqlkit as kit;
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::validate;

/// The MariaDB/MySQL driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct MysqlDriver;

impl MysqlDriver {
    pub fn new() -> Self {
        MysqlDriver
    }
}

/// The tables of a materialization's bindings, each named once.
pub(crate) fn spec_tables(spec: &flow::MaterializationSpec) -> Result<Vec<Table>> {
    // Table names compare case-insensitively on some servers (lower_case_table_names).
    let same_name = |a: &str, b: &str| a.to_lowercase() == b.to_lowercase();
    let tables = kit::spec_tables(spec, Some(NAME_LIMIT), same_name)?;
    Ok(tables.into_iter().map(Table).collect())
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
    let (mut conn, flavor) = client::connect(&endpoint).await?;
    let statements = match action {
        Action::Upsert => plan_upsert(&mut conn, flavor, &spec).await?,
        Action::Delete => plan_delete(&mut conn, &spec).await?,
    };
    if !req.dry_run {
        for statement in &statements {
            conn.query_drop(statement)
                .await
                .map_err(|err| client::my_error(format!("applying `{statement}`"), err))?;
        }
    }
    Ok(m::ApplyResponse {
        action_description: statements.iter().map(|s| format!("{s};\n")).collect(),
    })
}

/// Creates the checkpoints table and missing tables; adds missing columns.
async fn plan_upsert(
    conn: &mut Conn,
    flavor: sql::Flavor,
    spec: &flow::MaterializationSpec,
) -> Result<Vec<String>> {
    let mut statements = Vec::new();
    if client::existing_columns(conn, CHECKPOINTS_TABLE)
        .await?
        .is_empty()
    {
        statements.push(sql::create_checkpoints_sql(flavor));
    }
    for table in spec_tables(spec)? {
        let existing = client::existing_columns(conn, &table.name).await?;
        if existing.is_empty() {
            statements.push(table.create_sql(flavor));
            continue;
        }
        statements.extend(
            (table.columns.iter())
                .filter(|c| !existing.contains(&c.field))
                .map(|c| table.add_column_sql(c, flavor)),
        );
    }
    Ok(statements)
}

/// Drops the tables of existing bindings and forgets the materialization's checkpoints.
async fn plan_delete(conn: &mut Conn, spec: &flow::MaterializationSpec) -> Result<Vec<String>> {
    let mut statements = Vec::new();
    for table in spec_tables(spec)? {
        if !client::existing_columns(conn, &table.name)
            .await?
            .is_empty()
        {
            statements.push(table.drop_sql());
        }
    }
    let has_checkpoints = !client::existing_columns(conn, CHECKPOINTS_TABLE)
        .await?
        .is_empty();
    if has_checkpoints && client::checkpoint_rows(conn, &spec.materialization).await? > 0 {
        statements.push(format!(
            "DELETE FROM {} WHERE `materialization` = {}",
            sql::quote_ident(CHECKPOINTS_TABLE),
            sql::quote_literal(&spec.materialization)
        ));
    }
    Ok(statements)
}

#[async_trait]
impl Driver for MysqlDriver {
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
                path: vec![endpoint.database(), resource.table],
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
        let (transactor, flow_checkpoint) = MysqlTransactor::open(open).await?;
        Ok((Box::new(transactor), Opened { flow_checkpoint }))
    }
}
