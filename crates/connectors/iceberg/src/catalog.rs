//! An Iceberg SQL catalog over rusqlite, in the table layout of pyiceberg's `SqlCatalog`,
//! so pyiceberg (and iceberg-rust's `iceberg-catalog-sql`) read the tables we write
//! through the same catalog file.
//!
//! ```text
//!  iceberg_tables                    one row per table: the pointer to its metadata file
//!    catalog_name, table_namespace, table_name          (primary key)
//!    metadata_location, previous_metadata_location, iceberg_type ('TABLE')
//!  iceberg_namespace_properties      one row per namespace property ("exists" = "true"
//!    catalog_name, namespace, property_key, property_value   when it has none)
//! ```
//!
//! A namespace is its parts joined by `.`, as pyiceberg writes it. A table's default
//! location is `<warehouse>/<namespace>.db/<table>`, pyiceberg's default.
//!
//! What holds:
//! - A commit writes a new metadata file (a fresh name, never overwritten), then swaps
//!   the table's `metadata_location` with a compare-and-swap (`UPDATE … WHERE
//!   metadata_location = <base>`). After `update_table` returns, the new metadata is the
//!   table's; a lost swap is `CatalogCommitConflicts` and changes nothing visible (the
//!   unreferenced metadata file is removed, best effort).
//! - A catalog [`pinned`](SqlCatalog::pinned) to a metadata location commits only on
//!   top of exactly that location, and its conflicts are not retryable: iceberg's
//!   `Transaction::commit` then cannot rebase an append onto metadata the caller has not
//!   inspected (the sink's exactly-once check reads the base before committing).
//!
//! The same tables and statements work on PostgreSQL (`catalog: postgres://…`, over
//! tokio-postgres without TLS), the layout pyiceberg's `SqlCatalog` creates there too.
//! Statements are written with `$n` parameters (`?n` for SQLite), every value a string.
//!
//! Threads: rusqlite is synchronous; every SQLite statement runs on tokio's blocking
//! pool (`spawn_blocking`), one at a time through the connection's mutex. A PostgreSQL
//! statement runs on the caller's task, with a timeout ([`STATEMENT_TIMEOUT`]).

use crate::storage::{Warehouse, WarehouseIo};
use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, Runtime,
    TableCommit, TableCreation, TableIdent, TableRequirement, TableUpdate,
};
use rusqlite::Connection;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The `catalog_name` of every row we write: open the catalog in pyiceberg as
/// `SqlCatalog("sluice", uri="sqlite:///<file>", …)`.
pub const CATALOG_NAME: &str = "sluice";
/// The `iceberg_type` of a table row (pyiceberg's v1 catalog schema).
const TABLE_TYPE: &str = "TABLE";
/// How long a statement waits for another process's lock on the catalog file (pyiceberg
/// holds it only for the length of one statement).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a PostgreSQL statement may take before it is a (retryable) error: catalog
/// statements touch one row, so anything near this is a stuck server.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// pyiceberg's DDL (SQLAlchemy's, for SQLite), so either side may create the file.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS iceberg_tables (
	catalog_name VARCHAR(255) NOT NULL,
	table_namespace VARCHAR(255) NOT NULL,
	table_name VARCHAR(255) NOT NULL,
	metadata_location VARCHAR(1000),
	previous_metadata_location VARCHAR(1000),
	iceberg_type VARCHAR(5),
	PRIMARY KEY (catalog_name, table_namespace, table_name)
);
CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
	catalog_name VARCHAR(255) NOT NULL,
	namespace VARCHAR(255) NOT NULL,
	property_key VARCHAR(255) NOT NULL,
	property_value VARCHAR(1000) NOT NULL,
	PRIMARY KEY (catalog_name, namespace, property_key)
);";

/// Tables of this type (or of none: pyiceberg's v0 rows) are tables, not views.
const IS_TABLE: &str = "(iceberg_type = 'TABLE' OR iceberg_type IS NULL)";

/// Where the catalog's tables are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogLocation {
    /// A SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL URL (`postgres://…`), no TLS.
    Postgres(String),
}

#[derive(Debug)]
enum Backend {
    Sqlite(Mutex<Connection>),
    Postgres(tokio::sync::Mutex<tokio_postgres::Client>),
}

type Params = Vec<Option<String>>;
type Row = Vec<Option<String>>;

#[derive(Debug)]
struct Inner {
    backend: Backend,
    /// Where the tables' files are: a local folder or an S3 location.
    warehouse: WarehouseIo,
    runtime: Runtime,
}

/// The SQLite catalog. Cheap to clone (one shared connection).
#[derive(Debug, Clone)]
pub struct SqlCatalog {
    inner: Arc<Inner>,
    /// When set, commits swap only from this metadata location (see the module header).
    pin: Option<String>,
}

impl SqlCatalog {
    /// Opens (creating if needed) the catalog file `path`, with tables under `warehouse`.
    /// Must run inside a tokio runtime (tables spawn their scans on it).
    pub async fn open(path: &Path, warehouse: impl Into<Warehouse>) -> Result<SqlCatalog> {
        SqlCatalog::connect(&CatalogLocation::Sqlite(path.to_path_buf()), warehouse).await
    }

    /// Opens the catalog at `location` (creating its tables if missing), with tables
    /// under `warehouse` (a local folder, created if missing, or an S3 location). Must
    /// run inside a tokio runtime.
    pub async fn connect(
        location: &CatalogLocation,
        warehouse: impl Into<Warehouse>,
    ) -> Result<SqlCatalog> {
        let warehouse = warehouse
            .into()
            .open()
            .map_err(|e| Error::new(ErrorKind::Unexpected, e.to_string()))?;
        let backend = match location {
            CatalogLocation::Sqlite(path) => {
                let path = path.clone();
                let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
                    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                        std::fs::create_dir_all(parent).map_err(|e| {
                            io_error(format!("cannot create {}", parent.display()), e)
                        })?;
                    }
                    let conn = Connection::open(&path).map_err(sql_error)?;
                    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
                    conn.execute_batch(SCHEMA).map_err(sql_error)?;
                    Ok(conn)
                })
                .await
                .map_err(join_error)??;
                Backend::Sqlite(Mutex::new(conn))
            }
            CatalogLocation::Postgres(url) => {
                let (client, connection) = tokio::time::timeout(
                    STATEMENT_TIMEOUT,
                    tokio_postgres::connect(url, tokio_postgres::NoTls),
                )
                .await
                .map_err(|_| timeout_error("connecting to the PostgreSQL catalog"))?
                .map_err(pg_error)?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::warn!(error = %e, "the PostgreSQL catalog connection ended");
                    }
                });
                tokio::time::timeout(STATEMENT_TIMEOUT, client.batch_execute(SCHEMA))
                    .await
                    .map_err(|_| timeout_error("creating the catalog tables"))?
                    .map_err(pg_error)?;
                Backend::Postgres(tokio::sync::Mutex::new(client))
            }
        };
        Ok(SqlCatalog {
            inner: Arc::new(Inner {
                backend,
                warehouse,
                runtime: Runtime::try_current()?,
            }),
            pin: None,
        })
    }

    /// This catalog, committing only on top of `metadata_location`.
    pub fn pinned(&self, metadata_location: &str) -> SqlCatalog {
        SqlCatalog {
            inner: self.inner.clone(),
            pin: Some(metadata_location.to_string()),
        }
    }

    pub fn file_io(&self) -> &FileIO {
        self.inner.warehouse.file_io()
    }

    /// `file:///…` or `s3://…` of the warehouse.
    pub fn warehouse(&self) -> &str {
        self.inner.warehouse.root()
    }

    /// The warehouse's files: listing and removal under a prefix.
    pub fn storage(&self) -> &WarehouseIo {
        &self.inner.warehouse
    }

    /// The rows of `sql` (`$n` parameters), every column as text.
    async fn query(&self, sql: String, params: Params) -> Result<Vec<Row>> {
        match &self.inner.backend {
            Backend::Sqlite(_) => {
                let inner = self.inner.clone();
                tokio::task::spawn_blocking(move || {
                    let Backend::Sqlite(conn) = &inner.backend else {
                        unreachable!()
                    };
                    let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                    let mut stmt = conn.prepare(&sqlite_sql(&sql)).map_err(sql_error)?;
                    let n = stmt.column_count();
                    let rows = stmt
                        .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                            (0..n).map(|i| r.get::<_, Option<String>>(i)).collect()
                        })
                        .map_err(sql_error)?;
                    rows.collect::<rusqlite::Result<Vec<Row>>>()
                        .map_err(sql_error)
                })
                .await
                .map_err(join_error)?
            }
            Backend::Postgres(client) => {
                let client = client.lock().await;
                let refs = pg_params(&params);
                let rows = tokio::time::timeout(STATEMENT_TIMEOUT, client.query(&sql, &refs))
                    .await
                    .map_err(|_| timeout_error("a catalog query"))?
                    .map_err(pg_error)?;
                rows.iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| r.try_get::<_, Option<String>>(i).map_err(pg_error))
                            .collect()
                    })
                    .collect()
            }
        }
    }

    /// Runs `statements` in one transaction; the rows each changed.
    async fn execute(&self, statements: Vec<(String, Params)>) -> Result<Vec<u64>> {
        match &self.inner.backend {
            Backend::Sqlite(_) => {
                let inner = self.inner.clone();
                tokio::task::spawn_blocking(move || {
                    let Backend::Sqlite(conn) = &inner.backend else {
                        unreachable!()
                    };
                    let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                    let tx = conn.unchecked_transaction().map_err(sql_error)?;
                    let mut changed = Vec::with_capacity(statements.len());
                    for (sql, params) in &statements {
                        let n = tx
                            .execute(&sqlite_sql(sql), rusqlite::params_from_iter(params.iter()))
                            .map_err(sql_error)?;
                        changed.push(n as u64);
                    }
                    tx.commit().map_err(sql_error)?;
                    Ok(changed)
                })
                .await
                .map_err(join_error)?
            }
            Backend::Postgres(client) => {
                let mut client = client.lock().await;
                let work = async {
                    let tx = client.transaction().await?;
                    let mut changed = Vec::with_capacity(statements.len());
                    for (sql, params) in &statements {
                        changed.push(tx.execute(sql.as_str(), &pg_params(params)).await?);
                    }
                    tx.commit().await?;
                    Ok::<_, tokio_postgres::Error>(changed)
                };
                tokio::time::timeout(STATEMENT_TIMEOUT, work)
                    .await
                    .map_err(|_| timeout_error("a catalog update"))?
                    .map_err(pg_error)
            }
        }
    }

    async fn execute_one(&self, sql: String, params: Params) -> Result<u64> {
        Ok(self.execute(vec![(sql, params)]).await?[0])
    }

    /// The table's current metadata location, or `None` when there is no such table.
    pub async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        let rows = self
            .query(
                format!(
                    "SELECT metadata_location FROM iceberg_tables
                     WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3
                       AND {IS_TABLE}"
                ),
                strings([CATALOG_NAME, &ns_string(ident.namespace()), ident.name()]),
            )
            .await?;
        Ok(rows.into_iter().next().and_then(|mut r| r.swap_remove(0)))
    }

    async fn namespace_rows(&self) -> Result<BTreeSet<String>> {
        let rows = self
            .query(
                "SELECT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1
                 UNION SELECT table_namespace FROM iceberg_tables WHERE catalog_name = $1"
                    .into(),
                strings([CATALOG_NAME]),
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|mut r| r.swap_remove(0))
            .collect())
    }

    fn build_table(
        &self,
        ident: TableIdent,
        location: String,
        metadata: TableMetadata,
    ) -> Result<Table> {
        Table::builder()
            .file_io(self.file_io().clone())
            .identifier(ident)
            .metadata_location(location)
            .metadata(metadata)
            .runtime(self.inner.runtime.clone())
            .build()
    }

    async fn properties(&self, ns: &str) -> Result<HashMap<String, String>> {
        let rows = self
            .query(
                "SELECT property_key, property_value FROM iceberg_namespace_properties
                 WHERE catalog_name = $1 AND namespace = $2"
                    .into(),
                strings([CATALOG_NAME, ns]),
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|mut r| Some((r[0].take()?, r[1].take()?)))
            .collect())
    }

    async fn write_properties(&self, ns: &str, properties: HashMap<String, String>) -> Result<()> {
        let mut properties = properties;
        if properties.is_empty() {
            properties.insert("exists".into(), "true".into());
        }
        let mut statements = vec![(
            "DELETE FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2"
                .to_string(),
            strings([CATALOG_NAME, ns]),
        )];
        for (k, v) in &properties {
            statements.push((
                "INSERT INTO iceberg_namespace_properties
                 (catalog_name, namespace, property_key, property_value) VALUES ($1, $2, $3, $4)"
                    .into(),
                strings([CATALOG_NAME, ns, k, v]),
            ));
        }
        self.execute(statements).await?;
        Ok(())
    }

    async fn insert_table(&self, ident: &TableIdent, location: &str) -> Result<()> {
        let inserted = self
            .execute_one(
                "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name,
                 metadata_location, previous_metadata_location, iceberg_type)
                 VALUES ($1, $2, $3, $4, NULL, $5) ON CONFLICT DO NOTHING"
                    .into(),
                strings([
                    CATALOG_NAME,
                    &ns_string(ident.namespace()),
                    ident.name(),
                    location,
                    TABLE_TYPE,
                ]),
            )
            .await?;
        if inserted == 0 {
            return Err(Error::new(
                ErrorKind::TableAlreadyExists,
                format!("table {ident} already exists"),
            ));
        }
        Ok(())
    }
}

fn strings<const N: usize>(values: [&str; N]) -> Params {
    values.iter().map(|v| Some(v.to_string())).collect()
}

/// SQLite spells `$n` as `?n`.
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn pg_params(params: &Params) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect()
}

fn pg_error(e: tokio_postgres::Error) -> Error {
    // A closed connection or a serialization failure may pass; a bad statement will not.
    let retryable = e.is_closed()
        || e.code().is_none_or(|c| {
            *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
        });
    Error::new(ErrorKind::Unexpected, format!("PostgreSQL catalog: {e}")).with_retryable(retryable)
}

fn timeout_error(what: &str) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("{what} took longer than {STATEMENT_TIMEOUT:?}"),
    )
    .with_retryable(true)
}

fn ns_string(ns: &NamespaceIdent) -> String {
    ns.join(".")
}

fn sql_error(e: rusqlite::Error) -> Error {
    Error::new(ErrorKind::Unexpected, format!("SQLite catalog: {e}")).with_retryable(matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    ))
}

fn io_error(what: String, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what}: {e}"))
}

fn join_error(e: tokio::task::JoinError) -> Error {
    Error::new(ErrorKind::Unexpected, format!("a catalog task failed: {e}"))
}

fn no_namespace(ns: &NamespaceIdent) -> Error {
    Error::new(
        ErrorKind::NamespaceNotFound,
        format!("no namespace {}", ns_string(ns)),
    )
}

fn no_table(ident: &TableIdent) -> Error {
    Error::new(ErrorKind::TableNotFound, format!("no table {ident}"))
}

#[async_trait]
impl Catalog for SqlCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        let all = self.namespace_rows().await?;
        let depth = parent.map_or(0, |p| p.len());
        let prefix = parent.map(|p| format!("{}.", ns_string(p)));
        let mut out = BTreeSet::new();
        for ns in all {
            if prefix.as_ref().is_some_and(|p| !ns.starts_with(p.as_str())) {
                continue;
            }
            let parts: Vec<&str> = ns.split('.').collect();
            if parts.len() > depth {
                out.insert(parts[..=depth].join("."));
            }
        }
        out.into_iter()
            .map(|ns| NamespaceIdent::from_strs(ns.split('.')))
            .collect()
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        if self.namespace_exists(namespace).await? {
            return Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {} already exists", ns_string(namespace)),
            ));
        }
        self.write_properties(&ns_string(namespace), properties.clone())
            .await?;
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        let properties = self.properties(&ns_string(namespace)).await?;
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        let ns = ns_string(namespace);
        Ok(self.namespace_rows().await?.contains(&ns))
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        self.write_properties(&ns_string(namespace), properties)
            .await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        if !self.list_tables(namespace).await?.is_empty() {
            return Err(Error::new(
                ErrorKind::PreconditionFailed,
                format!("namespace {} is not empty", ns_string(namespace)),
            ));
        }
        self.execute_one(
            "DELETE FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2"
                .into(),
            strings([CATALOG_NAME, &ns_string(namespace)]),
        )
        .await?;
        Ok(())
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let rows = self
            .query(
                format!(
                    "SELECT table_name FROM iceberg_tables
                     WHERE catalog_name = $1 AND table_namespace = $2 AND {IS_TABLE}
                     ORDER BY table_name"
                ),
                strings([CATALOG_NAME, &ns_string(namespace)]),
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|mut r| r.swap_remove(0))
            .map(|n| TableIdent::new(namespace.clone(), n))
            .collect())
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        if self.table_exists(&ident).await? {
            return Err(Error::new(
                ErrorKind::TableAlreadyExists,
                format!("table {ident} already exists"),
            ));
        }
        let location = match &creation.location {
            Some(location) => location.clone(),
            None => format!(
                "{}/{}.db/{}",
                self.inner.warehouse.root(),
                ns_string(namespace),
                ident.name()
            ),
        };
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata
            .write_to(self.inner.warehouse.file_io(), &metadata_location)
            .await?;
        let metadata_location = metadata_location.to_string();
        self.insert_table(&ident, &metadata_location).await?;
        self.build_table(ident, metadata_location, metadata)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let location = self
            .metadata_location(ident)
            .await?
            .ok_or_else(|| no_table(ident))?;
        let metadata = TableMetadata::read_from(self.inner.warehouse.file_io(), &location).await?;
        self.build_table(ident.clone(), location, metadata)
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let deleted = self
            .execute_one(
                format!(
                    "DELETE FROM iceberg_tables
                     WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3
                       AND {IS_TABLE}"
                ),
                strings([CATALOG_NAME, &ns_string(ident.namespace()), ident.name()]),
            )
            .await?;
        if deleted == 0 {
            return Err(no_table(ident));
        }
        Ok(())
    }

    async fn purge_table(&self, ident: &TableIdent) -> Result<()> {
        let table = self.load_table(ident).await?;
        self.drop_table(ident).await?;
        iceberg::drop_table_data(&table).await
    }

    async fn table_exists(&self, ident: &TableIdent) -> Result<bool> {
        Ok(self.metadata_location(ident).await?.is_some())
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        if src == dest {
            return Ok(());
        }
        if !self.namespace_exists(dest.namespace()).await? {
            return Err(no_namespace(dest.namespace()));
        }
        if self.table_exists(dest).await? {
            return Err(Error::new(
                ErrorKind::TableAlreadyExists,
                format!("table {dest} already exists"),
            ));
        }
        let renamed = self
            .execute_one(
                format!(
                    "UPDATE iceberg_tables SET table_namespace = $1, table_name = $2
                     WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5
                       AND {IS_TABLE}"
                ),
                strings([
                    &ns_string(dest.namespace()),
                    dest.name(),
                    CATALOG_NAME,
                    &ns_string(src.namespace()),
                    src.name(),
                ]),
            )
            .await?;
        if renamed == 0 {
            return Err(no_table(src));
        }
        Ok(())
    }

    async fn register_table(&self, ident: &TableIdent, metadata_location: String) -> Result<Table> {
        let metadata =
            TableMetadata::read_from(self.inner.warehouse.file_io(), &metadata_location).await?;
        self.insert_table(ident, &metadata_location).await?;
        self.build_table(ident.clone(), metadata_location, metadata)
    }

    /// Writes the committed metadata, then swaps it in with a compare-and-swap from the
    /// current location (or from the pinned one).
    async fn update_table(&self, mut commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let (requirements, updates) = (commit.take_requirements(), commit.take_updates());
        self.commit_updates(&ident, requirements, updates).await
    }
}

impl SqlCatalog {
    /// What [`Catalog::update_table`] does, from a commit's parts (iceberg builds a
    /// `TableCommit` only inside its own `Transaction`, and the sink's row-delta snapshot,
    /// `rowdelta.rs`, is made outside one): the same pin, the same compare-and-swap.
    pub async fn commit_updates(
        &self,
        ident: &TableIdent,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Table> {
        let current = self.load_table(ident).await?;
        let base = current.metadata_location_result()?.to_string();
        let conflict = |what: String| {
            Error::new(ErrorKind::CatalogCommitConflicts, what).with_retryable(self.pin.is_none())
        };
        if let Some(pin) = &self.pin
            && *pin != base
        {
            return Err(conflict(format!(
                "table {ident} moved from {pin} to {base} since it was read"
            )));
        }
        for requirement in &requirements {
            requirement.check(Some(current.metadata()))?;
        }
        let mut builder = current.metadata().clone().into_builder(Some(base.clone()));
        for update in updates {
            builder = update.apply(builder)?;
        }
        let metadata = builder.build()?.metadata;
        let location = MetadataLocation::from_str(&base)?
            .with_next_version()
            .with_new_metadata(&metadata);
        metadata.write_to(self.file_io(), &location).await?;
        let location = location.to_string();
        fail::fail_point!(crate::MID_APPLY, |_| Err(Error::new(
            ErrorKind::Unexpected,
            format!("injected by fail point {}", crate::MID_APPLY)
        )
        .with_retryable(true)));
        // The compare-and-swap: only from the base this commit was computed on. ($6 is
        // $2 again: PostgreSQL types each parameter once, by its first use.)
        let swapped = self
            .execute_one(
                format!(
                    "UPDATE iceberg_tables
                     SET metadata_location = $1, previous_metadata_location = $2
                     WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5
                       AND {IS_TABLE} AND metadata_location = $6"
                ),
                strings([
                    &location,
                    &base,
                    CATALOG_NAME,
                    &ns_string(ident.namespace()),
                    ident.name(),
                    &base,
                ]),
            )
            .await?;
        if swapped == 0 {
            // Nobody references the file we wrote: remove it (a leftover is harmless).
            let _ = self.inner.warehouse.file_io().delete(&location).await;
            return Err(conflict(format!(
                "table {ident} was committed by another writer since {base}"
            )));
        }
        self.build_table(ident.clone(), location, metadata)
    }
}
