//! Range fencing over a checkpoints table, once for every SQL store: the claim protocol
//! at Open, the fenced checkpoint update of every commit, and the fence read that
//! explains a failed one. A dialect supplies only its SQL text ([`FenceSql`], from a
//! [`FenceDialect`]) and the client calls that run it ([`FenceClient`]).
//!
//! ```text
//!   claim_range (at Open, one transaction, claims of a materialization serialized by
//!                the dialect's lock: pg_advisory_xact_lock, GET_LOCK, BEGIN IMMEDIATE):
//!     fence += 1 on every stored range overlapping [b, e]    -- waits for in-flight commits
//!     checkpoint ← narrowest stored range covering [b, e]     -- read after the fence
//!     INSERT own range (fence 1, that checkpoint) unless present
//!     our fence ← own range's fence
//!   commit_checkpoint (inside the commit's transaction, after its writes, before COMMIT):
//!     UPDATE own range SET checkpoint WHERE fence = ours      -- 1 row, else Fenced
//! ```
//!
//! Why this fences: a commit's UPDATE locks its range's row until COMMIT. A newer Open
//! bumps the fence of that row first, so it either waits for the older commit and then
//! reads its checkpoint, or runs first, and the older commit's UPDATE then finds no row
//! with its fence. A zombie therefore never commits after a newer instance has opened,
//! and the newer instance never recovers a checkpoint older than the data it sees.
//! Fence first, then read: the read is a new statement (PostgreSQL: a new snapshot;
//! MariaDB: a locking read, which sees the latest committed row), so it includes the
//! commit the fence waited for. Reading before the fence could resume from a checkpoint
//! older than the data. SQLite serializes writers (BEGIN IMMEDIATE), so any order holds
//! there; it uses the same one.
//!
//! Apply records the applied spec's version as the row of the reserved range
//! `[-1, -1]` ([`VERSION_RANGE`]; its checkpoint column holds the version's text): no
//! key range overlaps or covers it, so claims never bump or recover it, and Apply's
//! delete forgets it with the ranges. A claim reads it first and refuses an Open of
//! another version ([`sluice_driver_sdk::fence::check_version`]).
//!
//! A zombie whose Loads went stale may fail before its commit's UPDATE, storing as
//! absent a key the newer instance wrote: the store then reads [`current_fence`] and
//! [`sluice_driver_sdk::fence::RangeFence::explain`] reports the failure as
//! [`Error::Fenced`] if the fence moved.

use async_trait::async_trait;
use sluice_driver_sdk::fence::{Claim, check_version};
use sluice_driver_sdk::{Error, Result};

/// The `key_begin` and `key_end` of the row recording the applied spec's version.
pub const VERSION_RANGE: i64 = -1;

/// A parameter of a fencing statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}

/// What differs between dialects in the text of the fencing statements.
#[derive(Debug, Clone, Copy)]
pub struct FenceDialect {
    /// Quotes an identifier.
    pub quote: fn(&str) -> String,
    /// The `n`th parameter (from 1); parameters always appear in the order bound.
    pub placeholder: fn(usize) -> String,
    /// `INSERT` that does nothing when the row is present: the text before `INTO` and
    /// after `VALUES (…)`.
    pub insert_ignore: (&'static str, &'static str),
    /// Appended to the read of the covering checkpoint: `" FOR UPDATE"` where a plain
    /// read would see a snapshot from before the commit the fence waited for.
    pub locking_read: &'static str,
}

impl FenceDialect {
    /// `$1, $2, …` (PostgreSQL).
    pub fn dollar(n: usize) -> String {
        format!("${n}")
    }

    /// `?, ?, …` (MariaDB, MySQL).
    pub fn question(_n: usize) -> String {
        "?".to_owned()
    }

    /// `?1, ?2, …` (SQLite).
    pub fn numbered(n: usize) -> String {
        format!("?{n}")
    }
}

/// The fencing statements over one checkpoints table. Every statement but `commit`
/// binds (materialization, key_begin, key_end) first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceSql {
    /// Bumps the fence of every overlapping range: binds (m, b, e).
    pub bump: String,
    /// The checkpoint of the narrowest covering range: binds (m, b, e).
    pub covering: String,
    /// Inserts the own range at fence 1 unless present: binds (m, b, e, checkpoint).
    pub insert: String,
    /// The own range's fence: binds (m, b, e).
    pub fence: String,
    /// Records the checkpoint where the fence is ours: binds (checkpoint, m, b, e, fence).
    pub commit: String,
    /// The version Apply recorded ([`VERSION_RANGE`]): binds (m).
    pub applied_version: String,
}

impl FenceSql {
    /// The statements over `table` (already quoted and qualified) in `dialect`.
    pub fn new(table: &str, dialect: FenceDialect) -> FenceSql {
        let q = dialect.quote;
        let p = dialect.placeholder;
        let (m, b, e, f, c) = (
            q("materialization"),
            q("key_begin"),
            q("key_end"),
            q("fence"),
            q("checkpoint"),
        );
        let own = |first: usize| {
            format!(
                "{m} = {} AND {b} = {} AND {e} = {}",
                p(first),
                p(first + 1),
                p(first + 2)
            )
        };
        let (insert, ignore) = dialect.insert_ignore;
        FenceSql {
            bump: format!(
                "UPDATE {table} SET {f} = {f} + 1 WHERE {m} = {} AND {e} >= {} AND {b} <= {}",
                p(1),
                p(2),
                p(3)
            ),
            covering: format!(
                "SELECT {c} FROM {table} WHERE {m} = {} AND {b} <= {} AND {e} >= {} \
                 ORDER BY {e} - {b} LIMIT 1{}",
                p(1),
                p(2),
                p(3),
                dialect.locking_read
            ),
            insert: format!(
                "{insert} INTO {table} VALUES ({}, {}, {}, 1, {}){ignore}",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            fence: format!("SELECT {f} FROM {table} WHERE {}", own(1)),
            commit: format!(
                "UPDATE {table} SET {c} = {} WHERE {} AND {f} = {}",
                p(1),
                own(2),
                p(5)
            ),
            applied_version: format!(
                "SELECT {c} FROM {table} WHERE {m} = {} AND {b} = {VERSION_RANGE} \
                 AND {e} = {VERSION_RANGE}",
                p(1)
            ),
        }
    }
}

/// The client calls fencing needs, on one connection.
#[async_trait]
pub trait FenceClient: Send {
    /// Runs a statement; returns the rows it matched.
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64>;

    /// The first column of the first row, if any (`None` also for SQL NULL).
    async fn query_bytes(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Vec<u8>>>;

    /// The first column of the first row, if any.
    async fn query_int(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>>;

    /// Begins the claim transaction of `materialization`, holding the lock that
    /// serializes its claims.
    async fn begin_claim(&mut self, materialization: &str) -> Result<()>;

    /// Ends the claim transaction (commits it if `commit`, else rolls it back) and
    /// releases the lock. A commit is durable when this returns.
    async fn end_claim(&mut self, materialization: &str, commit: bool) -> Result<()>;

    /// Commits the store transaction open on the connection; durable when this returns.
    async fn commit(&mut self) -> Result<()>;
}

/// `err` with the context `context` (what was being done), same message and hint.
fn within(context: &str) -> impl Fn(Error) -> Error + '_ {
    move |err| match err {
        Error::Store {
            message, retryable, ..
        } => Error::Store {
            context: context.to_owned(),
            message,
            retryable,
        },
        other => other,
    }
}

/// Fences every overlapping range of `materialization` and recovers the checkpoint of
/// the narrowest stored range covering `[key_begin, key_end]` (empty if none): a split
/// shard resumes from its parent's checkpoint, and records it as its own. Refuses, and
/// changes nothing, if `version` is not the version Apply recorded.
///
/// Postcondition: after this returns, older instances of every overlapping range hold a
/// stale fence, so their [`commit_checkpoint`] matches no row; this claim holds the
/// current one, durably.
pub async fn claim_range(
    client: &mut dyn FenceClient,
    sql: &FenceSql,
    materialization: &str,
    version: &str,
    key_begin: u32,
    key_end: u32,
) -> Result<(Claim, Vec<u8>)> {
    let context =
        format!("fencing key range [{key_begin:08x}, {key_end:08x}] of {materialization:?}");
    let range = [
        Param::Text(materialization),
        Param::Int(key_begin.into()),
        Param::Int(key_end.into()),
    ];
    client
        .begin_claim(materialization)
        .await
        .map_err(within(&context))?;
    let claimed = claim_locked(client, sql, (materialization, version), &range).await;
    let ended = client.end_claim(materialization, claimed.is_ok()).await;
    let (fence, checkpoint) = match claimed {
        Err(err @ Error::Config(_)) => return Err(err),
        claimed => claimed.map_err(within(&context))?,
    };
    ended.map_err(within(&context))?;
    Ok((
        Claim::new(materialization, key_begin, key_end, fence),
        checkpoint,
    ))
}

/// The statements of [`claim_range`], inside its transaction and lock.
async fn claim_locked(
    client: &mut dyn FenceClient,
    sql: &FenceSql,
    (materialization, version): (&str, &str),
    range: &[Param<'_>; 3],
) -> Result<(i64, Vec<u8>)> {
    let applied = (client
        .query_bytes(&sql.applied_version, &[range[0]])
        .await?)
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    check_version(materialization, applied.as_deref(), version)?;
    // Fence first: see the module docs.
    client.execute(&sql.bump, range).await?;
    let checkpoint = (client.query_bytes(&sql.covering, range).await?).unwrap_or_default();
    let [m, b, e] = *range;
    client
        .execute(&sql.insert, &[m, b, e, Param::Bytes(&checkpoint)])
        .await?;
    let fence = client.query_int(&sql.fence, range).await?;
    let fence = fence.ok_or_else(|| {
        Error::store(
            "reading the claimed fence",
            "the range's row is missing right after its insert",
            true,
        )
    })?;
    Ok((fence, checkpoint))
}

/// Within the caller's open transaction: records `checkpoint` for the claimed range if
/// the claim's fence is still current (and locks the range's row until the transaction
/// ends), else fails with [`Error::Fenced`]; the caller then rolls back.
pub async fn commit_checkpoint(
    client: &mut dyn FenceClient,
    sql: &FenceSql,
    claim: &Claim,
    checkpoint: &[u8],
) -> Result<()> {
    let params = [
        Param::Bytes(checkpoint),
        Param::Text(&claim.materialization),
        Param::Int(claim.key_begin.into()),
        Param::Int(claim.key_end.into()),
        Param::Int(claim.fence),
    ];
    let updated = (client.execute(&sql.commit, &params).await)
        .map_err(within("committing the runtime checkpoint"))?;
    committed(claim, updated)
}

/// The commit path of every SQL store, within the caller's open transaction after its
/// writes: [`commit_checkpoint`], then COMMIT.
///
/// Postcondition: after `Ok`, the transaction's writes and `checkpoint` are durable
/// together; after an error nothing of them is committed (a fenced claim commits
/// nothing), and the caller rolls back.
pub async fn commit(
    client: &mut dyn FenceClient,
    sql: &FenceSql,
    claim: &Claim,
    checkpoint: &[u8],
) -> Result<()> {
    // From here on the range's row is locked, so no newer Open can slip in before COMMIT.
    commit_checkpoint(client, sql, claim, checkpoint).await?;
    client.commit().await
}

/// What a commit's checkpoint update that matched `updated` rows means: exactly one is
/// the own range at the claimed fence; none is a fence moved by a newer instance (or a
/// row deleted by Apply's delete), so the commit must not happen.
pub fn committed(claim: &Claim, updated: u64) -> Result<()> {
    match updated {
        1 => Ok(()),
        _ => Err(claim.range_fence().fenced(None)),
    }
}

/// The claimed range's fence as committed now (`None` if its row is gone), read outside
/// any transaction to explain a failed store or commit.
pub async fn current_fence(
    client: &mut dyn FenceClient,
    sql: &FenceSql,
    claim: &Claim,
) -> Result<Option<i64>> {
    let params = [
        Param::Text(&claim.materialization),
        Param::Int(claim.key_begin.into()),
        Param::Int(claim.key_end.into()),
    ];
    (client.query_int(&sql.fence, &params).await)
        .map_err(within("reading the fence of the claimed range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quote(name: &str) -> String {
        format!("\"{name}\"")
    }

    const PG: FenceDialect = FenceDialect {
        quote,
        placeholder: FenceDialect::dollar,
        insert_ignore: ("INSERT", " ON CONFLICT DO NOTHING"),
        locking_read: "",
    };

    #[test]
    fn a_commit_holds_the_fence_only_if_it_updated_exactly_one_row() {
        let claim = Claim::new("m", 0, u32::MAX, 3);
        for (updated, fenced) in [(0, true), (1, false), (2, true)] {
            match committed(&claim, updated) {
                Ok(()) => assert!(!fenced, "{updated} rows"),
                Err(err) => {
                    assert!(fenced, "{updated} rows: {err}");
                    assert!(matches!(err, Error::Fenced(_)), "{err}");
                    assert!(err.to_string().contains("stale fence 3"), "{err}");
                }
            }
        }
    }

    #[test]
    fn statements_bind_their_parameters_in_order() {
        let sql = FenceSql::new("\"s\".\"cp\"", PG);
        assert_eq!(
            sql,
            FenceSql {
                bump: "UPDATE \"s\".\"cp\" SET \"fence\" = \"fence\" + 1 WHERE \
                       \"materialization\" = $1 AND \"key_end\" >= $2 AND \"key_begin\" <= $3"
                    .into(),
                covering: "SELECT \"checkpoint\" FROM \"s\".\"cp\" WHERE \"materialization\" = $1 \
                           AND \"key_begin\" <= $2 AND \"key_end\" >= $3 \
                           ORDER BY \"key_end\" - \"key_begin\" LIMIT 1"
                    .into(),
                insert:
                    "INSERT INTO \"s\".\"cp\" VALUES ($1, $2, $3, 1, $4) ON CONFLICT DO NOTHING"
                        .into(),
                fence: "SELECT \"fence\" FROM \"s\".\"cp\" WHERE \"materialization\" = $1 \
                        AND \"key_begin\" = $2 AND \"key_end\" = $3"
                    .into(),
                commit:
                    "UPDATE \"s\".\"cp\" SET \"checkpoint\" = $1 WHERE \"materialization\" = $2 \
                         AND \"key_begin\" = $3 AND \"key_end\" = $4 AND \"fence\" = $5"
                        .into(),
                applied_version: "SELECT \"checkpoint\" FROM \"s\".\"cp\" WHERE \
                                  \"materialization\" = $1 AND \"key_begin\" = -1 AND \
                                  \"key_end\" = -1"
                    .into(),
            }
        );
        let my = FenceSql::new(
            "`cp`",
            FenceDialect {
                quote: |name| format!("`{name}`"),
                placeholder: FenceDialect::question,
                insert_ignore: ("INSERT IGNORE", ""),
                locking_read: " FOR UPDATE",
            },
        );
        assert_eq!(my.insert, "INSERT IGNORE INTO `cp` VALUES (?, ?, ?, 1, ?)");
        assert!(
            my.covering.ends_with("LIMIT 1 FOR UPDATE"),
            "{}",
            my.covering
        );
        assert_eq!(FenceDialect::numbered(2), "?2");
    }

    /// A client that records what runs and answers from a script; `fail` names the
    /// statement that fails.
    #[derive(Default)]
    struct Recorder {
        log: Vec<String>,
        covering: Option<Vec<u8>>,
        version: Option<Vec<u8>>,
        fence: Option<i64>,
        fail: Option<&'static str>,
        /// The rows every UPDATE or INSERT matches.
        matched: u64,
    }

    impl Recorder {
        fn run(&mut self, what: String) -> Result<()> {
            let failed = self.fail.is_some_and(|fail| what.starts_with(fail));
            self.log.push(what);
            match failed {
                true => Err(Error::store("running", "boom", true)),
                false => Ok(()),
            }
        }
    }

    #[async_trait]
    impl FenceClient for Recorder {
        async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
            self.run(format!("{} {}", &sql[..6], params.len()))?;
            Ok(self.matched)
        }
        async fn query_bytes(&mut self, sql: &str, _: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
            if sql.contains(&format!("= {VERSION_RANGE}")) {
                self.run(format!("{} version", &sql[..6]))?;
                return Ok(self.version.clone());
            }
            self.run(format!("{} checkpoint", &sql[..6]))?;
            Ok(self.covering.clone())
        }
        async fn query_int(&mut self, sql: &str, _: &[Param<'_>]) -> Result<Option<i64>> {
            self.run(format!("{} fence", &sql[..6]))?;
            Ok(self.fence)
        }
        async fn begin_claim(&mut self, materialization: &str) -> Result<()> {
            self.run(format!("BEGIN {materialization}"))
        }
        async fn end_claim(&mut self, _: &str, commit: bool) -> Result<()> {
            self.run(if commit { "COMMIT" } else { "ROLLBACK" }.into())
        }
        async fn commit(&mut self) -> Result<()> {
            self.run("COMMIT".into())
        }
    }

    fn block_on<T>(future: impl Future<Output = T>) -> T {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(future)
    }

    fn claim(client: &mut Recorder) -> Result<(Claim, Vec<u8>)> {
        let sql = FenceSql::new("cp", PG);
        block_on(claim_range(client, &sql, "m", "v1", 16, 31))
    }

    #[test]
    fn a_commit_records_the_checkpoint_then_commits_and_a_fenced_one_commits_nothing() {
        let (sql, claim) = (FenceSql::new("cp", PG), Claim::new("m", 16, 31, 4));
        let mut client = Recorder {
            matched: 1,
            ..Recorder::default()
        };
        block_on(commit(&mut client, &sql, &claim, b"cp")).unwrap();
        assert_eq!(client.log, ["UPDATE 5", "COMMIT"]);
        let mut client = Recorder::default();
        let err = block_on(commit(&mut client, &sql, &claim, b"cp")).unwrap_err();
        assert!(matches!(err, Error::Fenced(_)), "{err}");
        assert_eq!(client.log, ["UPDATE 5"]);
    }

    #[test]
    fn a_claim_fences_before_it_reads_and_commits_under_its_lock() {
        let mut client = Recorder {
            covering: Some(b"cp".to_vec()),
            fence: Some(4),
            ..Recorder::default()
        };
        let (claim, checkpoint) = claim(&mut client).unwrap();
        assert_eq!(claim, Claim::new("m", 16, 31, 4));
        assert_eq!(checkpoint, b"cp");
        assert_eq!(
            client.log,
            [
                "BEGIN m",
                "SELECT version",
                "UPDATE 3",
                "SELECT checkpoint",
                "INSERT 4",
                "SELECT fence",
                "COMMIT"
            ]
        );
    }

    #[test]
    fn a_failed_claim_rolls_back_and_names_the_range() {
        for (fail, log) in [
            (
                "UPDATE",
                vec!["BEGIN m", "SELECT version", "UPDATE 3", "ROLLBACK"],
            ),
            (
                "INSERT",
                vec![
                    "BEGIN m",
                    "SELECT version",
                    "UPDATE 3",
                    "SELECT checkpoint",
                    "INSERT 4",
                    "ROLLBACK",
                ],
            ),
            ("BEGIN", vec!["BEGIN m"]),
        ] {
            let mut client = Recorder {
                fence: Some(1),
                fail: Some(fail),
                ..Recorder::default()
            };
            let err = claim(&mut client).unwrap_err();
            assert_eq!(
                err.to_string(),
                "fencing key range [00000010, 0000001f] of \"m\": boom",
                "{fail}"
            );
            assert_eq!(client.log, log, "{fail}");
        }
        // Another version than the applied one: refused before any fence moves.
        let mut client = Recorder {
            version: Some(b"v0".to_vec()),
            fence: Some(1),
            ..Recorder::default()
        };
        let err = claim(&mut client).unwrap_err();
        assert!(
            err.to_string()
                .contains("applied at version v0, but Open is for version v1"),
            "{err}"
        );
        assert_eq!(client.log, ["BEGIN m", "SELECT version", "ROLLBACK"]);
        // The own row missing right after its insert is an error, and rolls back.
        let mut client = Recorder::default();
        let err = claim(&mut client).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert_eq!(client.log.last().unwrap(), "ROLLBACK");
    }
}
