//! Apply, once for every SQL store: compare the spec's tables with the store's catalog
//! and run only what is missing, so re-applying the same spec runs nothing and a dry
//! run returns exactly the statements a real apply would run at that moment.
//!
//! ```text
//!   upsert:  create schema        (the dialect has schemas, and it is missing)
//!            create checkpoints   (its table has no columns)
//!            per table: a backfill (see below): drop it if it exists, then create it;
//!                       else create it, or add its missing columns;
//!                       then a comment per new column (dialects with comment statements)
//!            record the version   (another one is recorded, or none: the reserved
//!                                  range row of the checkpoints table, see crate::fence)
//!   delete:  drop each existing table;
//!            delete the materialization's checkpoint rows (and its version), if any
//! ```
//!
//! A connector supplies two things: its [`Catalog`] (what the store holds now, and how
//! it runs statements: PostgreSQL in one transaction, MariaDB statement by statement,
//! SQLite in one transaction) and its [`Ddl`] (the statements' text). The plan is a pure
//! function of what the catalog answers, in the order it asks.
//!
//! A backfill: a binding whose `backfill` counter rose against the binding of the same
//! resource path in the spec applied last (`ApplyRequest.last_materialization`, see
//! [`Target`]) has its table dropped and created anew, so its rows are gone; the runtime
//! then reads the binding's input again from the beginning. A binding new to the spec is
//! created as any other.
//!
//! A field selected in both specs whose type changed so that its existing column cannot
//! hold the new values (an integer column and a number, [`ColumnKind::holds`]) refuses
//! the Apply, naming the table, the field and both types, unless its binding is
//! backfilled: nothing is run, rather than rows stored wrong (MariaDB rounds 1.5 into a
//! BIGINT) or a store failing at every transaction.
//!
//! Spec and Validate are the same for every SQL store too: [`spec_response`] and
//! [`validate_tables`].

use crate::config::{NameLimit, TableResource};
use crate::fence::{FenceClient, FenceDialect, FenceSql, Param, VERSION_RANGE};
use crate::validate;
use crate::{Column, ColumnKind, Inferred, Table};
use async_trait::async_trait;
use sluice_driver_sdk::{Error, Result};
use sluice_driver_sdk::{flow, materialize as m};
use std::ops::Deref;

/// Which Apply call is being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Upsert,
    Delete,
}

/// What Apply reads from a store, and how it runs the plan there. The fencing client's
/// calls read the recorded version.
#[async_trait]
pub trait Catalog: FenceClient {
    /// The columns of `table`, empty if it does not exist.
    async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>>;

    /// Whether the endpoint's schema exists (asked only of dialects that create one).
    async fn schema_exists(&mut self) -> Result<bool> {
        Ok(true)
    }

    /// Whether the endpoint's schema holds anything (a table, view, sequence, type or
    /// function) besides the tables `ours` (asked only of dialects that drop one).
    async fn schema_holds_others(&mut self, ours: &[&str]) -> Result<bool> {
        let _ = ours;
        Ok(true)
    }

    /// Runs the (non-empty) plan, as atomically as the store allows.
    async fn execute(&mut self, statements: &[String]) -> Result<()>;
}

/// Open's check that `table` was applied: every column it selects exists. `shown`
/// names the table (quoted, qualified) and `server` the store in the error.
pub async fn check_applied<C>(
    catalog: &mut dyn Catalog,
    table: &Table<C>,
    shown: &str,
    server: &str,
) -> Result<()> {
    let existing = catalog.existing_columns(&table.name).await?;
    match (table.columns.iter()).find(|c| !existing.contains(&c.field)) {
        None => Ok(()),
        Some(missing) => Err(Error::Config(format!(
            "table {shown} has no column {:?} on {server}: apply the materialization first",
            missing.field
        ))),
    }
}

/// The catalog of a store that does not exist yet (a database file not created): a dry
/// run against it plans everything, and creates nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Empty;

#[async_trait]
impl Catalog for Empty {
    async fn existing_columns(&mut self, _table: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    async fn schema_exists(&mut self) -> Result<bool> {
        Ok(false)
    }

    async fn execute(&mut self, _statements: &[String]) -> Result<()> {
        Err(Empty::missing())
    }
}

impl Empty {
    fn missing() -> Error {
        Error::store(
            "applying",
            "the store does not exist (an empty catalog only plans dry runs)",
            false,
        )
    }
}

/// Nothing is recorded in a store that does not exist; it runs nothing.
#[async_trait]
impl FenceClient for Empty {
    async fn execute(&mut self, _sql: &str, _params: &[Param<'_>]) -> Result<u64> {
        Err(Empty::missing())
    }
    async fn query_bytes(&mut self, _sql: &str, _: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    async fn query_int(&mut self, _sql: &str, _: &[Param<'_>]) -> Result<Option<i64>> {
        Ok(None)
    }
    async fn begin_claim(&mut self, _materialization: &str) -> Result<()> {
        Err(Empty::missing())
    }
    async fn end_claim(&mut self, _materialization: &str, _commit: bool) -> Result<()> {
        Err(Empty::missing())
    }
    async fn commit(&mut self) -> Result<()> {
        Err(Empty::missing())
    }
}

/// The text of the statements Apply plans, and of the fencing statements
/// ([`crate::fence`]), in one dialect.
pub trait Ddl: Sync {
    type Kind: ColumnKind + Send + Sync;
    type Table: Deref<Target = Table<Self::Kind>> + Send + Sync;

    /// How the dialect quotes identifiers and spells the fencing statements.
    const FENCE: FenceDialect;

    /// The name of the checkpoints table, as the catalog knows it.
    const CHECKPOINTS_TABLE: &'static str = "sluice_checkpoints";

    /// The checkpoints table, quoted (and qualified) for statements.
    fn checkpoints(&self) -> String {
        self.qualified(Self::CHECKPOINTS_TABLE)
    }

    /// `text` as a string literal.
    fn literal(&self, text: &str) -> String;

    /// Creates the endpoint's schema, for dialects that have schemas.
    fn create_schema(&self) -> Option<String> {
        None
    }

    fn create_checkpoints(&self) -> String;

    fn create_table(&self, table: &Self::Table) -> String;

    /// Adds a (nullable) column that a later version of the binding selects.
    fn add_column(&self, table: &Self::Table, column: &Column<Self::Kind>) -> String;

    /// Names the source of a new column in the catalog, for dialects where that is a
    /// statement of its own.
    fn comment(&self, _table: &Self::Table, _column: &Column<Self::Kind>) -> Option<String> {
        None
    }

    fn drop_table(&self, table: &Self::Table) -> String {
        format!("DROP TABLE IF EXISTS {}", self.qualified(&table.name))
    }

    /// `name` quoted (and qualified) for statements.
    fn qualified(&self, name: &str) -> String;

    /// Drops the endpoint's schema once it is empty, for dialects that create one (and
    /// never a database's default schema).
    fn drop_schema(&self) -> Option<String> {
        None
    }

    /// Counts the checkpoint rows of `materialization` (`=` the parameter) or of every
    /// other one (`<>`): the first parameter is the materialization's name.
    fn count_checkpoints(&self, comparison: &str) -> String {
        format!(
            "SELECT count(*) FROM {} WHERE {} {comparison} {}",
            self.checkpoints(),
            (Self::FENCE.quote)("materialization"),
            (Self::FENCE.placeholder)(1)
        )
    }

    /// Forgets every checkpoint of `materialization`.
    fn delete_checkpoints(&self, materialization: &str) -> String {
        format!(
            "DELETE FROM {} WHERE {} = {}",
            self.checkpoints(),
            (Self::FENCE.quote)("materialization"),
            self.literal(materialization)
        )
    }

    /// Bytes (given as hex digits) as a literal of the checkpoint column's type.
    fn bytes_literal(&self, hex: &str) -> String {
        format!("X'{hex}'")
    }

    /// Records `version` as the applied one of `materialization` (see [`crate::fence`]),
    /// replacing the one recorded if `replace`.
    fn record_version(&self, materialization: &str, version: &str, replace: bool) -> Vec<String> {
        let q = Self::FENCE.quote;
        let (m, b, e) = (q("materialization"), q("key_begin"), q("key_end"));
        let name = self.literal(materialization);
        let delete = format!(
            "DELETE FROM {} WHERE {m} = {name} AND {b} = {VERSION_RANGE} AND {e} = {VERSION_RANGE}",
            self.checkpoints()
        );
        // Two first starts may apply at once: the second insert of the row does nothing.
        let (insert, ignore) = Self::FENCE.insert_ignore;
        let insert = format!(
            "{insert} INTO {} VALUES ({name}, {VERSION_RANGE}, {VERSION_RANGE}, 0, {}){ignore}",
            self.checkpoints(),
            self.bytes_literal(&sluice_doc::hex::encode(version.as_bytes()))
        );
        match replace {
            true => vec![delete, insert],
            false => vec![insert],
        }
    }

    /// The fencing statements over the checkpoints table.
    fn fence_sql(&self) -> FenceSql {
        FenceSql::new(&self.checkpoints(), Self::FENCE)
    }
}

/// What an Apply is for: the materialization, the version of its spec, the bindings
/// whose tables are rebuilt (a backfill), and the fields whose type changed since the
/// spec applied last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub materialization: &'a str,
    pub version: &'a str,
    /// Indices into the spec's bindings (and so into its tables, one per binding, in
    /// order) whose backfill counter rose against `last`'s binding of the same
    /// resource path.
    pub rebuild: Vec<usize>,
    /// Selected fields of bindings not rebuilt whose shape differs from the one `last`
    /// selected them with: their column may not hold the new values.
    pub retyped: Vec<Retyped>,
}

/// A selected field whose shape changed between the spec applied last and this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retyped {
    /// Index into the spec's bindings (and tables).
    pub binding: usize,
    pub field: String,
    pub was: Inferred,
    pub now: Inferred,
}

impl<'a> Target<'a> {
    /// The Apply of `spec` at `version`, after `last` (the spec applied last, if any).
    pub fn new(
        spec: &'a flow::MaterializationSpec,
        version: &'a str,
        last: Option<&flow::MaterializationSpec>,
    ) -> Target<'a> {
        let mut rebuild = Vec::new();
        let mut retyped = Vec::new();
        for (i, binding) in spec.bindings.iter().enumerate() {
            let Some(before) = last.and_then(|last| {
                (last.bindings.iter()).find(|l| l.resource_path == binding.resource_path)
            }) else {
                continue;
            };
            if binding.backfill > before.backfill {
                rebuild.push(i);
                continue;
            }
            for field in value_fields(binding) {
                let (Some(was), Some(now)) = (shape(before, field), shape(binding, field)) else {
                    continue;
                };
                if was != now && value_fields(before).any(|f| f == field) {
                    retyped.push(Retyped {
                        binding: i,
                        field: field.to_owned(),
                        was,
                        now,
                    });
                }
            }
        }
        Target {
            materialization: &spec.materialization,
            version,
            rebuild,
            retyped,
        }
    }
}

/// The selected key and value fields of `binding` (not its document field): the
/// columns typed by their projection.
fn value_fields(binding: &flow::materialization_spec::Binding) -> impl Iterator<Item = &str> {
    let selection = binding.field_selection.as_ref();
    (selection.into_iter())
        .flat_map(|s| s.keys.iter().chain(&s.values))
        .map(String::as_str)
}

/// The shape of `field` in `binding`'s collection.
fn shape(binding: &flow::materialization_spec::Binding, field: &str) -> Option<Inferred> {
    let collection = binding.collection.as_ref()?;
    let projection = collection.projections.iter().find(|p| p.field == field)?;
    Inferred::of(projection)
}

/// Refuses an Apply whose retyped fields' existing columns cannot hold the new shape
/// ([`ColumnKind::holds`]).
fn check_retyped<K: ColumnKind>(
    tables: &[&str],
    retyped: &[Retyped],
    existing: impl Fn(usize, &str) -> bool,
) -> Result<()> {
    let refused: Vec<String> = (retyped.iter())
        .filter(|r| existing(r.binding, &r.field) && !K::holds(r.was, r.now))
        .map(|r| {
            format!(
                "table {:?}: field {:?} was {} and is now {}, which its {} column cannot hold",
                tables[r.binding],
                r.field,
                r.was.name(),
                r.now.name(),
                K::STORE,
            )
        })
        .collect();
    match refused.is_empty() {
        true => Ok(()),
        false => Err(Error::Config(format!(
            "{}; raise the binding's `backfill` to drop and rebuild its table (its input is read \
             again), or project the field under a new name",
            refused.join("; ")
        ))),
    }
}

/// Plans `action` for `tables` of `target` from what `catalog` holds now, runs the plan
/// unless `dry_run`, and describes it (one `statement;` per line).
pub async fn apply<D: Ddl>(
    catalog: &mut dyn Catalog,
    ddl: &D,
    tables: &[D::Table],
    target: Target<'_>,
    action: Action,
    dry_run: bool,
) -> Result<m::ApplyResponse> {
    let statements = match action {
        Action::Upsert => plan_upsert(catalog, ddl, tables, &target).await?,
        Action::Delete => plan_delete(catalog, ddl, tables, target.materialization).await?,
    };
    if !dry_run && !statements.is_empty() {
        Catalog::execute(catalog, &statements).await?;
    }
    Ok(m::ApplyResponse {
        action_description: statements.iter().map(|s| format!("{s};\n")).collect(),
        driver_checkpoint: None,
    })
}

/// Creates the schema, the checkpoints table and missing tables; drops and creates the
/// tables of a backfill; adds missing columns; records the version.
async fn plan_upsert<D: Ddl>(
    catalog: &mut dyn Catalog,
    ddl: &D,
    tables: &[D::Table],
    target: &Target<'_>,
) -> Result<Vec<String>> {
    let (materialization, version) = (target.materialization, target.version);
    let mut statements = Vec::new();
    if let Some(create) = ddl.create_schema()
        && !catalog.schema_exists().await?
    {
        statements.push(create);
    }
    let recorded = if catalog
        .existing_columns(D::CHECKPOINTS_TABLE)
        .await?
        .is_empty()
    {
        statements.push(ddl.create_checkpoints());
        None
    } else {
        let sql = ddl.fence_sql().applied_version;
        catalog
            .query_bytes(&sql, &[Param::Text(materialization)])
            .await?
    };
    let mut columns = Vec::with_capacity(tables.len());
    for table in tables {
        columns.push(catalog.existing_columns(&table.name).await?);
    }
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    check_retyped::<D::Kind>(&names, &target.retyped, |i, field| {
        !target.rebuild.contains(&i) && columns[i].iter().any(|c| c == field)
    })?;
    for ((i, table), mut existing) in tables.iter().enumerate().zip(columns) {
        if target.rebuild.contains(&i) && !existing.is_empty() {
            statements.push(ddl.drop_table(table));
            existing.clear();
        }
        let added: Vec<_> = if existing.is_empty() {
            statements.push(ddl.create_table(table));
            table.columns.iter().collect()
        } else {
            let missing: Vec<_> = (table.columns.iter())
                .filter(|c| !existing.contains(&c.field))
                .collect();
            statements.extend(missing.iter().map(|c| ddl.add_column(table, c)));
            missing
        };
        statements.extend(added.iter().filter_map(|c| ddl.comment(table, c)));
    }
    if recorded.as_deref() != Some(version.as_bytes()) {
        statements.extend(ddl.record_version(materialization, version, recorded.is_some()));
    }
    Ok(statements)
}

/// Drops the tables of existing bindings and forgets the materialization's checkpoints;
/// then drops what Apply created for it alone: the checkpoints table once no other
/// materialization has a row there, and then the schema once it holds nothing else.
async fn plan_delete<D: Ddl>(
    catalog: &mut dyn Catalog,
    ddl: &D,
    tables: &[D::Table],
    materialization: &str,
) -> Result<Vec<String>> {
    let mut statements = Vec::new();
    for table in tables {
        if !catalog.existing_columns(&table.name).await?.is_empty() {
            statements.push(ddl.drop_table(table));
        }
    }
    let has_checkpoints = !catalog
        .existing_columns(D::CHECKPOINTS_TABLE)
        .await?
        .is_empty();
    let mut checkpoints_left = has_checkpoints;
    if has_checkpoints {
        let name = [Param::Text(materialization)];
        let count = |comparison| ddl.count_checkpoints(comparison);
        let others = catalog.query_int(&count("<>"), &name).await?;
        if others.unwrap_or(0) == 0 {
            statements.push(format!("DROP TABLE IF EXISTS {}", ddl.checkpoints()));
            checkpoints_left = false;
        } else if catalog.query_int(&count("="), &name).await?.unwrap_or(0) > 0 {
            statements.push(ddl.delete_checkpoints(materialization));
        }
    }
    if let Some(drop) = ddl.drop_schema()
        && !checkpoints_left
        && catalog.schema_exists().await?
    {
        let mut ours: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
        ours.push(D::CHECKPOINTS_TABLE);
        if !catalog.schema_holds_others(&ours).await? {
            statements.push(drop);
        }
    }
    Ok(statements)
}

/// Spec's answer: the connector's schemas and documentation.
pub fn spec_response(
    endpoint_schema: &str,
    resource_schema: String,
    documentation_url: &str,
) -> m::SpecResponse {
    m::SpecResponse {
        endpoint_spec_schema_json: endpoint_schema.to_owned(),
        resource_spec_schema_json: resource_schema,
        documentation_url: documentation_url.to_owned(),
    }
}

/// Validate of a store whose columns are of kind `C` and whose bindings are
/// [`TableResource`]s (names checked against `limit`); `path` gives a table's resource
/// path, outermost first (e.g. schema, table).
pub fn validate_tables<C: ColumnKind>(
    req: &m::ValidateRequest,
    limit: Option<NameLimit>,
    path: impl Fn(String) -> Vec<String>,
) -> Result<m::ValidateResponse> {
    validate::validate(&validate::Store::of::<C>(), req, |json| {
        let resource = TableResource::parse(json, limit)?;
        Ok(validate::Resource {
            path: path(resource.table),
            delta_updates: resource.delta_updates,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Inferred;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Kind;

    impl ColumnKind for Kind {
        const STORE: &'static str = "TestDB";
        const DOCUMENT: Self = Kind;
        fn of_inferred(_: Inferred) -> Self {
            Kind
        }
    }

    crate::table_newtype!(TestTable(Kind));

    /// A dialect whose statements name what they do, with schemas and comments.
    struct TestDdl;

    impl Ddl for TestDdl {
        type Kind = Kind;
        type Table = TestTable;
        const FENCE: FenceDialect = FenceDialect {
            quote: |name| format!("<{name}>"),
            placeholder: FenceDialect::question,
            insert_ignore: ("INSERT", ""),
            locking_read: "",
        };
        fn qualified(&self, name: &str) -> String {
            format!("s.<{name}>")
        }
        fn literal(&self, text: &str) -> String {
            format!("'{text}'")
        }
        fn create_schema(&self) -> Option<String> {
            Some("create schema".into())
        }
        fn create_checkpoints(&self) -> String {
            "create checkpoints".into()
        }
        fn drop_schema(&self) -> Option<String> {
            Some("drop schema".into())
        }
        fn create_table(&self, table: &TestTable) -> String {
            format!("create {}", table.name)
        }
        fn add_column(&self, table: &TestTable, column: &Column<Kind>) -> String {
            format!("add {}.{}", table.name, column.field)
        }
        fn comment(&self, table: &TestTable, column: &Column<Kind>) -> Option<String> {
            Some(format!("comment {}.{}", table.name, column.field))
        }
    }

    /// A store as a map of table → columns, plus checkpoint rows, the recorded version
    /// and the schema.
    #[derive(Default)]
    struct Model {
        schema: bool,
        tables: BTreeMap<String, Vec<String>>,
        checkpoint_rows: u64,
        /// Checkpoint rows of other materializations.
        other_checkpoint_rows: u64,
        /// The schema holds objects Apply did not create.
        others_in_schema: bool,
        version: Option<Vec<u8>>,
        executed: Vec<String>,
    }

    /// Answers only the read of the recorded version.
    #[async_trait]
    impl FenceClient for Model {
        async fn execute(&mut self, sql: &str, _: &[Param<'_>]) -> Result<u64> {
            panic!("Apply ran a fencing statement: {sql}")
        }
        async fn query_bytes(&mut self, sql: &str, _: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
            assert!(sql.contains("= -1"), "{sql}");
            Ok(self.version.clone())
        }
        async fn query_int(&mut self, sql: &str, _: &[Param<'_>]) -> Result<Option<i64>> {
            assert!(
                sql.starts_with("SELECT count(*)"),
                "Apply read a fence: {sql}"
            );
            let rows = match sql.contains("<>") {
                true => self.other_checkpoint_rows,
                false => self.checkpoint_rows,
            };
            Ok(Some(rows as i64))
        }
        async fn begin_claim(&mut self, _: &str) -> Result<()> {
            panic!("Apply claimed")
        }
        async fn end_claim(&mut self, _: &str, _: bool) -> Result<()> {
            panic!("Apply claimed")
        }
        async fn commit(&mut self) -> Result<()> {
            panic!("Apply committed a store transaction")
        }
    }

    #[async_trait]
    impl Catalog for Model {
        async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>> {
            Ok(self.tables.get(table).cloned().unwrap_or_default())
        }
        async fn schema_exists(&mut self) -> Result<bool> {
            Ok(self.schema)
        }
        async fn schema_holds_others(&mut self, ours: &[&str]) -> Result<bool> {
            let ours_present = (self.tables.keys()).all(|t| ours.contains(&t.as_str()));
            Ok(self.others_in_schema || !ours_present)
        }
        async fn execute(&mut self, statements: &[String]) -> Result<()> {
            self.executed.extend_from_slice(statements);
            Ok(())
        }
    }

    /// Table `t` of columns `k` (key), `v`, `doc`.
    fn table() -> TestTable {
        let column = |field: &str, key| Column {
            field: field.into(),
            ptr: format!("/{field}"),
            ty: Kind,
            key,
        };
        TestTable(Table {
            name: "t".into(),
            collection: "c".into(),
            columns: vec![column("k", true), column("v", false), column("doc", false)],
            key_count: 1,
            has_document: true,
            delta_updates: false,
        })
    }

    fn model(schema: bool, tables: &[(&str, &[&str])], checkpoint_rows: u64) -> Model {
        Model {
            schema,
            tables: (tables.iter())
                .map(|(t, cs)| (t.to_string(), cs.iter().map(|c| c.to_string()).collect()))
                .collect(),
            checkpoint_rows,
            other_checkpoint_rows: 0,
            others_in_schema: false,
            version: None,
            executed: Vec::new(),
        }
    }

    /// `model` where another materialization has checkpoints too.
    fn shared(tables: &[(&str, &[&str])], checkpoint_rows: u64) -> Model {
        Model {
            other_checkpoint_rows: 2,
            ..model(true, tables, checkpoint_rows)
        }
    }

    /// `model` with version `v1` recorded.
    fn applied(tables: &[(&str, &[&str])], version: &[u8]) -> Model {
        Model {
            version: Some(version.to_vec()),
            ..model(true, tables, 1)
        }
    }

    /// The statement recording version `v1` of `m`, and the one replacing another.
    const RECORD_V1: &str =
        "INSERT INTO s.<sluice_checkpoints> VALUES ('m', -1, -1, 0, X'7631');\n";
    const REPLACE: &str = "DELETE FROM s.<sluice_checkpoints> WHERE <materialization> = 'm' \
                           AND <key_begin> = -1 AND <key_end> = -1;\n";

    fn run(catalog: &mut Model, action: Action, dry_run: bool) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let applied = runtime.block_on(apply(
            catalog,
            &TestDdl,
            &[table()],
            target(&[]),
            action,
            dry_run,
        ));
        applied.unwrap().action_description
    }

    const CP: &str = "sluice_checkpoints";

    /// Materialization `m` at version `v1`, rebuilding the tables at `rebuild`.
    fn target(rebuild: &[usize]) -> Target<'static> {
        Target {
            materialization: "m",
            version: "v1",
            rebuild: rebuild.to_vec(),
            retyped: Vec::new(),
        }
    }

    #[test]
    fn a_raised_backfill_drops_and_creates_its_table() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let plan = |catalog: &mut Model, rebuild: &[usize]| {
            let applied = runtime.block_on(apply(
                catalog,
                &TestDdl,
                &[table()],
                target(rebuild),
                Action::Upsert,
                false,
            ));
            applied.unwrap().action_description
        };
        let tables: &[(&str, &[&str])] = &[(CP, &["fence"]), ("t", &["k", "v", "doc"])];
        let mut store = applied(tables, b"v1");
        assert_eq!(
            plan(&mut store, &[0]),
            "DROP TABLE IF EXISTS s.<t>;\ncreate t;\ncomment t.k;\ncomment t.v;\ncomment t.doc;\n"
        );
        // A table that does not exist (yet) is created, nothing dropped.
        let mut empty = applied(&[(CP, &["fence"])], b"v1");
        assert_eq!(
            plan(&mut empty, &[0]),
            "create t;\ncomment t.k;\ncomment t.v;\ncomment t.doc;\n"
        );
    }

    /// A store whose column type is the shape itself: an integer column does not hold
    /// numbers, a number column holds integers, a text column date-times.
    impl ColumnKind for Inferred {
        const STORE: &'static str = "ShapeDB";
        const DOCUMENT: Self = Inferred::Other;
        fn of_inferred(inferred: Inferred) -> Self {
            inferred
        }
    }

    #[test]
    fn a_field_whose_column_cannot_hold_its_new_shape_refuses_the_apply_unless_rebuilt() {
        use crate::Inferred::{DateTime, Integer, Number, Other, String as Text};
        let projection = |field: &str, types: &[&str]| flow::Projection {
            field: field.into(),
            ptr: format!("/{field}"),
            inference: Some(flow::Inference {
                types: types.iter().map(|t| t.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let binding = |v: &[&str], w: &[&str], backfill| flow::materialization_spec::Binding {
            resource_path: vec!["t".to_string()],
            backfill,
            collection: Some(flow::CollectionSpec {
                projections: vec![
                    projection("k", &["string"]),
                    projection("v", v),
                    projection("w", w),
                ],
                ..Default::default()
            }),
            field_selection: Some(flow::FieldSelection {
                keys: vec!["k".into()],
                values: vec!["v".into(), "w".into()],
                document: "flow_document".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = |b| flow::MaterializationSpec {
            materialization: "m".into(),
            bindings: vec![b],
            ..Default::default()
        };
        let last = spec(binding(&["integer"], &["number"], 0));
        let next = spec(binding(&["number"], &["integer"], 0));
        let target = Target::new(&next, "v2", Some(&last));
        assert_eq!(
            (target.retyped.iter())
                .map(|r| (r.field.as_str(), r.was, r.now))
                .collect::<Vec<_>>(),
            [("v", Integer, Number), ("w", Number, Integer)]
        );
        // Raised: the table is rebuilt, nothing is retyped.
        let rebuilt = spec(binding(&["number"], &["integer"], 1));
        let target = Target::new(&rebuilt, "v2", Some(&last));
        assert_eq!((target.rebuild, target.retyped), (vec![0], vec![]));

        let retyped = |field: &str, was, now| Retyped {
            binding: 0,
            field: field.into(),
            was,
            now,
        };
        let check = |r: Retyped, exists: bool| {
            check_retyped::<Inferred>(&["t"], &[r], |_, _| exists).map_err(|e| e.to_string())
        };
        let refused = check(retyped("v", Integer, Number), true).unwrap_err();
        assert!(
            refused.contains("table \"t\": field \"v\" was integer and is now number, which its ShapeDB column cannot hold")
                && refused.contains("raise the binding's `backfill`"),
            "{refused}"
        );
        assert!(check(retyped("w", Number, Integer), true).is_ok());
        assert!(check(retyped("s", Text, DateTime), true).is_ok());
        assert!(check(retyped("s", DateTime, Text), true).is_err());
        assert!(check(retyped("o", Other, Integer), true).is_ok());
        // A column the table does not have (yet) is added, whatever it held before.
        assert!(check(retyped("v", Integer, Number), false).is_ok());
    }

    #[test]
    fn the_tables_rebuilt_are_the_bindings_whose_counter_rose() {
        let binding = |table: &str, backfill| flow::materialization_spec::Binding {
            resource_path: vec![table.to_string()],
            backfill,
            ..Default::default()
        };
        let spec = |bindings| flow::MaterializationSpec {
            materialization: "m".into(),
            bindings,
            ..Default::default()
        };
        let last = spec(vec![binding("a", 1), binding("b", 0), binding("c", 0)]);
        let next = spec(vec![
            binding("b", 0),
            binding("a", 2),
            binding("c", 0),
            binding("d", 3),
        ]);
        assert_eq!(Target::new(&next, "v2", Some(&last)).rebuild, vec![1]);
        assert_eq!(Target::new(&next, "v2", None).rebuild, Vec::<usize>::new());
        // Lowered: nothing to rebuild (the counter only asks when it rises).
        assert!(Target::new(&last, "v1", Some(&next)).rebuild.is_empty());
    }

    #[test]
    fn the_plan_is_what_the_catalog_lacks() {
        let upsert = Action::Upsert;
        let delete = Action::Delete;
        let all: &[(&str, &[&str])] = &[(CP, &["fence"]), ("t", &["k", "v", "doc"])];
        let cases: [(&str, Model, Action, String); 12] = [
            (
                "empty store: everything, comments on every column, the version",
                model(false, &[], 0),
                upsert,
                format!(
                    "create schema;\ncreate checkpoints;\ncreate t;\n\
                     comment t.k;\ncomment t.v;\ncomment t.doc;\n{RECORD_V1}"
                ),
            ),
            (
                "schema present",
                model(true, &[], 0),
                upsert,
                format!(
                    "create checkpoints;\ncreate t;\ncomment t.k;\ncomment t.v;\n\
                     comment t.doc;\n{RECORD_V1}"
                ),
            ),
            (
                "a column missing: added, then commented",
                applied(&[(CP, &["fence"]), ("t", &["k", "doc"])], b"v1"),
                upsert,
                "add t.v;\ncomment t.v;\n".into(),
            ),
            (
                "all there: nothing",
                applied(all, b"v1"),
                upsert,
                String::new(),
            ),
            (
                "another version recorded: the version",
                applied(all, b"v0"),
                upsert,
                format!("{REPLACE}{RECORD_V1}"),
            ),
            (
                "no version recorded: the version",
                model(true, all, 3),
                upsert,
                RECORD_V1.into(),
            ),
            (
                "delete of the schema's only materialization: all it created goes",
                model(true, &[(CP, &["fence"]), ("t", &["k"])], 2),
                delete,
                "DROP TABLE IF EXISTS s.<t>;\nDROP TABLE IF EXISTS s.<sluice_checkpoints>;\n\
                 drop schema;\n"
                    .into(),
            ),
            (
                "delete beside another materialization: its checkpoint rows only",
                shared(&[(CP, &["fence"]), ("t", &["k"])], 2),
                delete,
                "DROP TABLE IF EXISTS s.<t>;\nDELETE FROM s.<sluice_checkpoints> \
                 WHERE <materialization> = 'm';\n"
                    .into(),
            ),
            (
                "delete beside another materialization, without checkpoint rows",
                shared(&[(CP, &["fence"]), ("t", &["k"])], 0),
                delete,
                "DROP TABLE IF EXISTS s.<t>;\n".into(),
            ),
            (
                "delete in a schema holding more: the schema stays",
                Model {
                    others_in_schema: true,
                    ..model(true, &[(CP, &["fence"]), ("t", &["k"])], 2)
                },
                delete,
                "DROP TABLE IF EXISTS s.<t>;\nDROP TABLE IF EXISTS s.<sluice_checkpoints>;\n"
                    .into(),
            ),
            (
                "delete without a checkpoints table",
                model(true, &[("t", &["k"])], 5),
                delete,
                "DROP TABLE IF EXISTS s.<t>;\ndrop schema;\n".into(),
            ),
            (
                "delete of nothing in a schema that is gone",
                model(false, &[], 0),
                delete,
                String::new(),
            ),
        ];
        for (case, mut catalog, action, want) in cases {
            let want = want.as_str();
            let dry = run(&mut catalog, action, true);
            assert_eq!(dry, want, "{case} (dry run)");
            assert!(catalog.executed.is_empty(), "{case}: a dry run executed");
            let real = run(&mut catalog, action, false);
            assert_eq!(
                real, dry,
                "{case}: the real apply runs what the dry run said"
            );
            let executed: String = catalog.executed.iter().map(|s| format!("{s};\n")).collect();
            assert_eq!(executed, real, "{case}");
        }
    }

    #[test]
    fn an_empty_catalog_plans_everything_and_executes_nothing() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let tables = [table()];
        let plan = runtime.block_on(apply(
            &mut Empty,
            &TestDdl,
            &tables,
            target(&[]),
            Action::Upsert,
            true,
        ));
        assert!(
            plan.unwrap()
                .action_description
                .starts_with("create schema;\n")
        );
        let real = runtime.block_on(apply(
            &mut Empty,
            &TestDdl,
            &tables,
            target(&[]),
            Action::Upsert,
            false,
        ));
        assert!(real.is_err());
    }
}
