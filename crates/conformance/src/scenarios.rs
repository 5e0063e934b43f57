//! The scenarios, in the order they run. Each one, what it needs the driver to claim
//! ([`Capability`]), and what it checks:
//!
//! | scenario | needs | checks |
//! |---|---|---|
//! | `spec-schemas` | | Spec returns endpoint and resource JSON schemas that compile and accept the configurations given to the suite |
//! | `validate-key-constraints` | | Validate constrains every projection, requires the key field (FIELD_REQUIRED or LOCATION_REQUIRED), returns a resource path |
//! | `apply-dry-run` | dry-run | a dry run changes nothing (a second dry run and the real apply describe the same actions) |
//! | `apply-idempotence` | | re-applying the same spec keeps stored documents |
//! | `fresh-open` | | a never-used materialization opens, runs an empty transaction and acknowledges |
//! | `rebuild-sentinel` | | the Opened checkpoint of a never-committed range is empty or exactly the rebuild sentinel `f8 ff ff ff 0f 01` |
//! | `absent-keys-load-nothing` | | loads of keys never stored return no documents |
//! | `store-commit-acknowledge` | | new keys (exists=false) store, commit (DriverCommitted) and acknowledge |
//! | `pipelined-loads-read-committed` | | Loads of T+1 sent before T's Acknowledge return exactly T's stores |
//! | `loads-sent-during-commit-read-committed` | | Loads of T+1 sent right after Commit of T, before DriverCommitted is read (then DriverCommitted, Acknowledge, Prepare of T+1), return exactly T's stores, updates included, and T+1 commits |
//! | `reopen-recovers-checkpoint` | | a new stream recovers the runtime checkpoint committed last (an authoritative driver exactly that one; any other that one or none) and loads exactly what was stored |
//! | `updates` | | a document stored with exists=true replaces the previous one |
//! | `deletes` | deletes | a `null` document stored with exists=true removes the key; the other keys stay |
//! | `delta-updates` | delta-updates | a delta-updates binding takes stores (the same key twice, over two transactions) and is never loaded |
//! | `document-1-byte-value`, `document-1-mib`, `document-16-mib` | | documents of those sizes round-trip byte for byte |
//! | `many-bindings` | | one transaction stores into 8 bindings; loads return each binding's own documents |
//! | `failed-commit-commits-nothing` | strict-exists | a transaction storing a new key and a present key as absent fails whole: reopening recovers the prior checkpoint and loads neither of its documents |
//! | `second-open-fences-first` | authoritative | after a second Open of the same range, the first instance's next commit fails as fenced, its stores stay invisible, and the second commits on and is what a reopen recovers |
//! | `fenced-zombie-storing-a-key-the-newer-instance-committed` | authoritative | a zombie storing as absent a key the newer instance committed since fails as fenced (not as a duplicate), and the key keeps the newer document |
//! | `split-range-recovers-parent-then-own-checkpoints` | authoritative | both halves of a split range recover the parent's checkpoint and fence the parent; each then commits, and a half reopened recovers its own |
//! | `split-range-halves-resume-from-own-lineage` | authoritative | the right half, opened after the left half committed, resumes from the parent; the left half from its own commit |
//! | `out-of-order-requests-rejected` | | Store right after Open, Commit before Prepare, and a second Open each end the stream with an error naming the message |
//!
//! A claimed capability is checked strictly: a fenced commit must fail as
//! [`Error::Fenced`] (or, over a transport that loses error kinds, with an error that
//! says `fenced off`), and what a scenario stored is read back by Loads.

use crate::capability::Capability::{self, Authoritative, Deletes, DeltaUpdates, StrictExists};
use crate::fixture::{Fixture, Put, REBUILD_SENTINEL, collection, doc, loads, stores};
use crate::messages::open;
use crate::session::{Session, Txn};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;
use sluice_doc::Schema;
use sluice_driver_sdk::machine::Request;
use sluice_driver_sdk::materialize::{
    self as m, constraint,
    transaction_request::{Open, Store},
};
use sluice_driver_sdk::{Error, flow};

/// Why a scenario failed.
pub struct Failure(pub String);

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure(err.to_string())
    }
}

type Verdict = Result<(), Failure>;
type Run = for<'a> fn(&'a Fixture<'a>) -> BoxFuture<'a, Verdict>;

/// One scenario: its name, the capabilities it needs the driver to claim, its body.
pub struct Scenario {
    pub name: &'static str,
    pub needs: &'static [Capability],
    pub run: Run,
}

const fn scenario(name: &'static str, needs: &'static [Capability], run: Run) -> Scenario {
    Scenario { name, needs, run }
}

pub const ALL: [Scenario; 24] = [
    scenario("spec-schemas", &[], |fx| Box::pin(spec_schemas(fx))),
    scenario("validate-key-constraints", &[], |fx| {
        Box::pin(validate_key_constraints(fx))
    }),
    scenario("apply-dry-run", &[Capability::DryRun], |fx| {
        Box::pin(apply_dry_run(fx))
    }),
    scenario("apply-idempotence", &[], |fx| {
        Box::pin(apply_idempotence(fx))
    }),
    scenario("fresh-open", &[], |fx| Box::pin(fresh_open(fx))),
    scenario("rebuild-sentinel", &[], |fx| Box::pin(rebuild_sentinel(fx))),
    scenario("absent-keys-load-nothing", &[], |fx| {
        Box::pin(absent_keys_load_nothing(fx))
    }),
    scenario("store-commit-acknowledge", &[], |fx| {
        Box::pin(store_commit_acknowledge(fx))
    }),
    scenario("pipelined-loads-read-committed", &[], |fx| {
        Box::pin(pipelined_loads_read_committed(fx))
    }),
    scenario("loads-sent-during-commit-read-committed", &[], |fx| {
        Box::pin(loads_sent_during_commit_read_committed(fx))
    }),
    scenario("reopen-recovers-checkpoint", &[], |fx| {
        Box::pin(reopen_recovers_checkpoint(fx))
    }),
    scenario("updates", &[], |fx| Box::pin(updates(fx))),
    scenario("deletes", &[Deletes], |fx| Box::pin(deletes(fx))),
    scenario("delta-updates", &[DeltaUpdates], |fx| {
        Box::pin(delta_updates(fx))
    }),
    scenario("document-1-byte-value", &[], |fx| {
        Box::pin(document_of(fx, None))
    }),
    scenario("document-1-mib", &[], |fx| {
        Box::pin(document_of(fx, Some(1 << 20)))
    }),
    scenario("document-16-mib", &[], |fx| {
        Box::pin(document_of(fx, Some(16 << 20)))
    }),
    scenario("many-bindings", &[], |fx| Box::pin(many_bindings(fx))),
    scenario("failed-commit-commits-nothing", &[StrictExists], |fx| {
        Box::pin(failed_commit_commits_nothing(fx))
    }),
    scenario("second-open-fences-first", &[Authoritative], |fx| {
        Box::pin(second_open_fences_first(fx))
    }),
    scenario(
        "fenced-zombie-storing-a-key-the-newer-instance-committed",
        &[Authoritative],
        |fx| Box::pin(fenced_zombie_storing_a_key_the_newer_instance_committed(fx)),
    ),
    scenario(
        "split-range-recovers-parent-then-own-checkpoints",
        &[Authoritative],
        |fx| Box::pin(split_range_recovers_parent_then_own_checkpoints(fx)),
    ),
    scenario(
        "split-range-halves-resume-from-own-lineage",
        &[Authoritative],
        |fx| Box::pin(split_range_halves_resume_from_own_lineage(fx)),
    ),
    scenario("out-of-order-requests-rejected", &[], |fx| {
        Box::pin(out_of_order_requests_rejected(fx))
    }),
];

fn ensure(holds: bool, reason: impl FnOnce() -> String) -> Verdict {
    if holds {
        Ok(())
    } else {
        Err(Failure(reason()))
    }
}

/// Checks that `loaded` is exactly `expected`, in any order (both as (binding, document)).
fn ensure_loaded(what: &str, loaded: &[(u32, Value)], expected: Vec<(u32, Value)>) -> Verdict {
    let sorted = |mut docs: Vec<(u32, Value)>| {
        docs.sort_by_cached_key(|(binding, doc)| (*binding, doc.to_string()));
        docs
    };
    let (loaded, expected) = (sorted(loaded.to_vec()), sorted(expected));
    ensure(loaded == expected, || {
        format!(
            "{what}: loaded {}, expected {}",
            show(&loaded),
            show(&expected)
        )
    })
}

/// Checks that a commit of an instance a newer Open fenced off failed as fenced.
fn ensure_fenced<T>(what: &str, result: sluice_driver_sdk::Result<T>) -> Verdict {
    match result {
        Ok(_) => Err(Failure(format!(
            "{what} committed after a newer Open of its range"
        ))),
        Err(Error::Fenced(_)) => Ok(()),
        Err(err) => Err(Failure(format!(
            "{what} failed, but not as fenced off: {err}"
        ))),
    }
}

/// Checks the checkpoint a session opened with: exactly `committed` for an
/// authoritative driver, else that or none.
fn ensure_recovered(fx: &Fixture<'_>, what: &str, session: &Session, committed: &[u8]) -> Verdict {
    let recovered = session.recovered();
    let holds = recovered == committed || (!fx.claimed.authoritative && recovered.is_empty());
    ensure(holds, || {
        format!(
            "{what}: opened with checkpoint {:?}, but the last one committed was {:?}",
            String::from_utf8_lossy(recovered),
            String::from_utf8_lossy(committed)
        )
    })
}

/// Documents for a message, long values elided.
fn show(docs: &[(u32, Value)]) -> String {
    let items: Vec<String> = docs
        .iter()
        .map(|(binding, doc)| {
            let mut text = doc.to_string();
            if text.len() > 80 {
                let head: String = text.chars().take(60).collect();
                text = format!("{head}… ({} bytes)", text.len());
            }
            format!("binding {binding}: {text}")
        })
        .collect();
    format!("[{}]", items.join(", "))
}

fn put(id: i64, value: &str, exists: bool) -> Put {
    Put {
        binding: 0,
        id,
        doc: doc(id, value),
        exists,
    }
}

/// Keys `ids` of binding 0.
fn keys(ids: impl IntoIterator<Item = i64>) -> Vec<(u32, i64)> {
    ids.into_iter().map(|id| (0, id)).collect()
}

/// Applies one binding and opens a session of the whole range.
async fn open_one(fx: &Fixture<'_>) -> Result<Session, Failure> {
    let spec = fx.setup(1).await?;
    Ok(fx.session(&spec).await?)
}

/// A transaction storing `puts`, loading nothing, with the fixture's checkpoint `n`.
fn storing(fx: &Fixture<'_>, n: u32, puts: &[Put]) -> Txn {
    Txn {
        stores: stores(puts),
        checkpoint: fx.checkpoint(n),
        ..Txn::default()
    }
}

/// Commits `puts`, loading nothing, with the fixture's checkpoint `n`.
async fn commit(fx: &Fixture<'_>, session: &mut Session, n: u32, puts: &[Put]) -> Verdict {
    session.run(storing(fx, n, puts)).await?;
    Ok(())
}

/// Loads `ids` of binding 0 in a transaction that stores nothing.
async fn load(
    session: &mut Session,
    ids: impl IntoIterator<Item = i64>,
) -> Result<Vec<(u32, Value)>, Failure> {
    let txn = Txn {
        loads: loads(&keys(ids)),
        ..Txn::default()
    };
    Ok(session.run(txn).await?)
}

async fn spec_schemas(fx: &Fixture<'_>) -> Verdict {
    let spec = fx
        .endpoint
        .spec(m::SpecRequest {
            endpoint_type: 0,
            endpoint_spec_json: fx.config().to_string(),
        })
        .await?;
    let checks = [
        (
            "endpoint",
            &spec.endpoint_spec_schema_json,
            fx.config().clone(),
        ),
        ("resource", &spec.resource_spec_schema_json, fx.resource(0)),
    ];
    for (what, text, instance) in checks {
        let schema: Value = serde_json::from_str(text)
            .map_err(|err| Failure(format!("the {what} schema is not JSON: {err}")))?;
        ensure(schema.is_object(), || {
            format!("the {what} schema is not an object: {schema}")
        })?;
        let schema = Schema::compile(&schema)
            .map_err(|err| Failure(format!("the {what} schema does not compile: {err}")))?;
        schema.validate(&instance).map_err(|err| {
            Failure(format!(
                "the {what} configuration {instance} does not validate against the {what} schema: {err}"
            ))
        })?;
    }
    Ok(())
}

async fn validate_key_constraints(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.spec(1, |_| false);
    let request = m::ValidateRequest {
        materialization: spec.materialization.clone(),
        endpoint_type: 0,
        endpoint_spec_json: fx.config().to_string(),
        bindings: vec![m::validate_request::Binding {
            resource_spec_json: fx.resource(0).to_string(),
            collection: Some(collection()),
            field_config_json: Default::default(),
            backfill: 0,
        }],
    };
    let response = fx.endpoint.validate(request).await?;
    let [binding] = response.bindings.as_slice() else {
        return Err(Failure(format!(
            "validated 1 binding, got {} back",
            response.bindings.len()
        )));
    };
    for projection in collection().projections {
        ensure(binding.constraints.contains_key(&projection.field), || {
            format!("no constraint for field {:?}", projection.field)
        })?;
    }
    let key = binding.constraints["id"].r#type;
    let required = [
        constraint::Type::FieldRequired,
        constraint::Type::LocationRequired,
    ];
    ensure(required.iter().any(|t| *t as i32 == key), || {
        format!(
            "the key field `id` is {:?}, not FIELD_REQUIRED or LOCATION_REQUIRED",
            constraint::Type::try_from(key)
        )
    })?;
    ensure(!binding.resource_path.is_empty(), || {
        "the resource path is empty".into()
    })
}

async fn apply_dry_run(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.spec(1, |_| false);
    let dry = fx.apply(&spec, true).await?;
    let dry_again = fx.apply(&spec, true).await?;
    ensure(dry == dry_again, || {
        format!(
            "a second dry run described {dry_again:?} after the first described {dry:?}: the dry run changed something"
        )
    })?;
    let applied = fx.apply(&spec, false).await?;
    ensure(applied == dry, || {
        format!("apply described {applied:?}, its dry run {dry:?}")
    })
}

async fn apply_idempotence(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.spec(1, |_| false);
    fx.apply(&spec, false).await?;
    let mut session = fx.session(&spec).await?;
    commit(fx, &mut session, 1, &[put(1, "kept", false)]).await?;
    session.close().await?;
    fx.apply(&spec, false).await?;
    let mut session = fx.session(&spec).await?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded(
        "after re-applying the same spec",
        &loaded,
        vec![(0, doc(1, "kept"))],
    )
}

async fn fresh_open(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    session.run(storing(fx, 1, &[])).await?;
    Ok(session.close().await?)
}

async fn rebuild_sentinel(fx: &Fixture<'_>) -> Verdict {
    let session = open_one(fx).await?;
    let checkpoint = session.recovered();
    ensure(
        checkpoint.is_empty() || checkpoint[..] == REBUILD_SENTINEL,
        || {
            format!(
                "a range that never committed opened with checkpoint {checkpoint:02x?}: neither empty \
             (use the runtime's) nor the rebuild sentinel {REBUILD_SENTINEL:02x?}"
            )
        },
    )?;
    Ok(session.close().await?)
}

async fn absent_keys_load_nothing(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    let loaded = load(&mut session, 1..=3).await?;
    ensure_loaded("keys never stored", &loaded, Vec::new())?;
    Ok(session.close().await?)
}

async fn store_commit_acknowledge(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    let puts: Vec<Put> = (1..=3).map(|id| put(id, "new", false)).collect();
    let txn = Txn {
        loads: loads(&keys(1..=3)),
        ..storing(fx, 1, &puts)
    };
    session.run(txn).await?;
    Ok(session.close().await?)
}

async fn pipelined_loads_read_committed(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    let puts: Vec<Put> = (1..=3).map(|id| put(id, "first", false)).collect();
    commit(fx, &mut session, 1, &puts).await?;
    let pipelined = Txn {
        loads: loads(&keys(1..=4)),
        loads_first: true,
        ..storing(fx, 2, &[])
    };
    let loaded = session.run(pipelined).await?;
    let expected = (1..=3).map(|id| (0, doc(id, "first"))).collect();
    ensure_loaded("loads sent before the prior Acknowledge", &loaded, expected)?;
    Ok(session.close().await?)
}

async fn loads_sent_during_commit_read_committed(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    commit(fx, &mut session, 1, &[put(1, "first", false)]).await?;
    // T updates key 1 and adds key 2; T+1's Loads go out before T's DriverCommitted.
    let t = storing(fx, 2, &[put(1, "second", true), put(2, "second", false)]);
    let early = session.run_then_load(t, loads(&keys(1..=3))).await?;
    ensure_loaded("transaction 2, which loaded nothing", &early, Vec::new())?;
    let next = Txn {
        loads: loads(&keys([4])),
        ..storing(fx, 3, &[put(3, "third", false)])
    };
    let loaded = session.run(next).await?;
    let expected = vec![(0, doc(1, "second")), (0, doc(2, "second"))];
    ensure_loaded(
        "loads sent right after the prior Commit, before its DriverCommitted",
        &loaded,
        expected,
    )?;
    let loaded = load(&mut session, 1..=3).await?;
    let all = vec![
        (0, doc(1, "second")),
        (0, doc(2, "second")),
        (0, doc(3, "third")),
    ];
    ensure_loaded("after the pipelined transaction", &loaded, all)?;
    Ok(session.close().await?)
}

async fn reopen_recovers_checkpoint(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut session = fx.session(&spec).await?;
    commit(
        fx,
        &mut session,
        1,
        &[put(1, "one", false), put(2, "two", false)],
    )
    .await?;
    commit(fx, &mut session, 2, &[put(3, "three", false)]).await?;
    session.close().await?;

    let mut session = fx.session(&spec).await?;
    ensure_recovered(fx, "reopened", &session, &fx.checkpoint(2))?;
    let loaded = load(&mut session, 1..=4).await?;
    let expected = vec![(0, doc(1, "one")), (0, doc(2, "two")), (0, doc(3, "three"))];
    ensure_loaded("after reopening", &loaded, expected)?;
    Ok(session.close().await?)
}

async fn updates(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    commit(fx, &mut session, 1, &[put(1, "before", false)]).await?;
    let update = Txn {
        loads: loads(&keys([1])),
        ..storing(fx, 2, &[put(1, "after", true)])
    };
    let loaded = session.run(update).await?;
    ensure_loaded("before the update", &loaded, vec![(0, doc(1, "before"))])?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded("after the update", &loaded, vec![(0, doc(1, "after"))])?;
    Ok(session.close().await?)
}

async fn deletes(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    commit(
        fx,
        &mut session,
        1,
        &[put(1, "doomed", false), put(2, "kept", false)],
    )
    .await?;
    let delete = Put {
        binding: 0,
        id: 1,
        doc: Value::Null,
        exists: true,
    };
    let txn = Txn {
        loads: loads(&keys([1])),
        ..storing(fx, 2, &[delete])
    };
    session.run(txn).await.map_err(|err| {
        Failure(format!(
            "the driver claims deletes but refused a null document: {err}"
        ))
    })?;
    let loaded = load(&mut session, [1, 2]).await?;
    ensure_loaded("after deleting key 1", &loaded, vec![(0, doc(2, "kept"))])?;
    Ok(session.close().await?)
}

async fn delta_updates(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.spec(2, |binding| binding == 1);
    fx.apply(&spec, false).await?;
    let delta = |value: &str| Put {
        binding: 1,
        id: 1,
        doc: doc(1, value),
        exists: false,
    };
    let mut session = fx.session(&spec).await?;
    commit(
        fx,
        &mut session,
        1,
        &[put(1, "standard", false), delta("a"), delta("b")],
    )
    .await?;
    let txn = Txn {
        loads: loads(&keys([1])),
        ..storing(fx, 2, &[delta("c")])
    };
    let loaded = session.run(txn).await?;
    ensure_loaded(
        "the standard binding next to a delta one",
        &loaded,
        vec![(0, doc(1, "standard"))],
    )?;
    Ok(session.close().await?)
}

/// A document of exactly `size` bytes of JSON (or with a 1-byte value when `None`)
/// stores and loads back unchanged.
async fn document_of(fx: &Fixture<'_>, size: Option<usize>) -> Verdict {
    let value = match size {
        None => "x".to_string(),
        Some(size) => "x".repeat(size - doc(1, "").to_string().len()),
    };
    let mut session = open_one(fx).await?;
    commit(fx, &mut session, 1, &[put(1, &value, false)]).await?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded("the stored document", &loaded, vec![(0, doc(1, &value))])?;
    Ok(session.close().await?)
}

async fn many_bindings(fx: &Fixture<'_>) -> Verdict {
    const BINDINGS: u32 = 8;
    let spec = fx.setup(BINDINGS as usize).await?;
    let mut session = fx.session(&spec).await?;
    // Key 1 is in every binding with the binding's own value; key 100 + b only in b.
    let stored = |binding: u32| {
        [
            (binding, doc(1, &format!("b{binding}"))),
            (binding, doc(100 + i64::from(binding), "own")),
        ]
    };
    let puts: Vec<Put> = (0..BINDINGS)
        .flat_map(stored)
        .map(|(binding, doc)| Put {
            binding,
            id: doc["id"].as_i64().unwrap_or_default(),
            doc,
            exists: false,
        })
        .collect();
    commit(fx, &mut session, 1, &puts).await?;
    let all: Vec<(u32, i64)> = (0..BINDINGS)
        .flat_map(|binding| {
            std::iter::once(1)
                .chain(100..100 + i64::from(BINDINGS))
                .map(move |id| (binding, id))
        })
        .collect();
    let loaded = session
        .run(Txn {
            loads: loads(&all),
            ..Txn::default()
        })
        .await?;
    ensure_loaded(
        "across bindings",
        &loaded,
        (0..BINDINGS).flat_map(stored).collect(),
    )?;
    Ok(session.close().await?)
}

async fn failed_commit_commits_nothing(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut session = fx.session(&spec).await?;
    commit(fx, &mut session, 1, &[put(1, "first", false)]).await?;
    // Key 2 is new; key 1 is present but stored as absent: the whole commit fails.
    let wrong = storing(fx, 2, &[put(2, "new", false), put(1, "clobbered", false)]);
    ensure(session.run(wrong).await.is_err(), || {
        "a store of a present key as absent (exists=false) committed".into()
    })?;
    drop(session);
    let mut session = fx.session(&spec).await?;
    ensure_recovered(fx, "after the failed commit", &session, &fx.checkpoint(1))?;
    let loaded = load(&mut session, [1, 2]).await?;
    ensure_loaded(
        "after the failed commit",
        &loaded,
        vec![(0, doc(1, "first"))],
    )?;
    Ok(session.close().await?)
}

async fn second_open_fences_first(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut first = fx.session(&spec).await?;
    commit(fx, &mut first, 1, &[put(1, "first", false)]).await?;
    let mut second = fx.session(&spec).await?;
    ensure_recovered(fx, "the second instance", &second, &fx.checkpoint(1))?;
    let zombie = storing(fx, 2, &[put(2, "zombie", false)]);
    ensure_fenced("the first instance", first.run(zombie).await)?;
    let txn = Txn {
        loads: loads(&keys([1, 2])),
        ..storing(fx, 3, &[])
    };
    let loaded = second.run(txn).await?;
    ensure_loaded(
        "after the fenced commit",
        &loaded,
        vec![(0, doc(1, "first"))],
    )?;
    // The newer instance commits on, and its lineage is what a reopen recovers.
    commit(fx, &mut second, 4, &[]).await?;
    second.close().await?;
    let reopened = fx.session(&spec).await?;
    ensure_recovered(
        fx,
        "reopened after the zombie",
        &reopened,
        &fx.checkpoint(4),
    )?;
    Ok(reopened.close().await?)
}

async fn fenced_zombie_storing_a_key_the_newer_instance_committed(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut zombie = fx.session(&spec).await?;
    let mut newer = fx.session(&spec).await?;
    commit(fx, &mut newer, 1, &[put(1, "newer", false)]).await?;
    // The zombie's view is stale: it believes key 1 absent.
    let stale = storing(fx, 2, &[put(1, "zombie", false)]);
    ensure_fenced("the zombie", zombie.run(stale).await)?;
    let loaded = load(&mut newer, [1]).await?;
    ensure_loaded(
        "after the zombie's commit",
        &loaded,
        vec![(0, doc(1, "newer"))],
    )?;
    Ok(newer.close().await?)
}

/// The middle of the key range, where it splits.
const MID: u32 = 0x8000_0000;

/// Commits checkpoint 1 over the whole range, then opens the left half of the split:
/// it must recover checkpoint 1 and fence the parent. Returns the spec and the left half.
async fn split(fx: &Fixture<'_>) -> Result<(flow::MaterializationSpec, Session), Failure> {
    let spec = fx.setup(1).await?;
    let mut parent = fx.session(&spec).await?;
    commit(fx, &mut parent, 1, &[]).await?;
    let left = fx.session_of(&spec, 0, MID - 1).await?;
    ensure_recovered(fx, "the left half", &left, &fx.checkpoint(1))?;
    ensure_fenced("the parent", parent.run(storing(fx, 2, &[])).await)?;
    Ok((spec, left))
}

/// Closes the left half, which committed checkpoint `n`, and reopens it: it must
/// resume from its own, narrower range.
async fn left_half_resumes_from(
    fx: &Fixture<'_>,
    spec: &flow::MaterializationSpec,
    left: Session,
    n: u32,
) -> Verdict {
    left.close().await?;
    let left = fx.session_of(spec, 0, MID - 1).await?;
    ensure_recovered(fx, "the left half reopened", &left, &fx.checkpoint(n))?;
    Ok(left.close().await?)
}

async fn split_range_recovers_parent_then_own_checkpoints(fx: &Fixture<'_>) -> Verdict {
    let (spec, mut left) = split(fx).await?;
    let mut right = fx.session_of(&spec, MID, u32::MAX).await?;
    ensure_recovered(fx, "the right half", &right, &fx.checkpoint(1))?;
    commit(fx, &mut left, 3, &[]).await?;
    commit(fx, &mut right, 4, &[]).await?;
    right.close().await?;
    left_half_resumes_from(fx, &spec, left, 3).await
}

async fn split_range_halves_resume_from_own_lineage(fx: &Fixture<'_>) -> Verdict {
    let (spec, mut left) = split(fx).await?;
    commit(fx, &mut left, 3, &[]).await?;
    let right = fx.session_of(&spec, MID, u32::MAX).await?;
    ensure_recovered(
        fx,
        "the right half, after the left half committed",
        &right,
        &fx.checkpoint(1),
    )?;
    right.close().await?;
    left_half_resumes_from(fx, &spec, left, 3).await
}

async fn out_of_order_requests_rejected(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let open = open(&spec, 0, u32::MAX);
    let cases: [(&str, Vec<Request>); 3] = [
        ("Store", vec![Request::Store(Store::default())]),
        ("Commit", vec![Request::Acknowledge, Request::Commit]),
        ("Open", vec![Request::Open(open.clone())]),
    ];
    for (culprit, after_open) in cases {
        expect_rejection(fx, &open, culprit, after_open).await?;
    }
    Ok(())
}

/// Sends Open, then `after_open` on a raw stream (no client checks); the stream must end
/// with an error that names `culprit`.
async fn expect_rejection(
    fx: &Fixture<'_>,
    open: &Open,
    culprit: &str,
    after_open: Vec<Request>,
) -> Verdict {
    let mut stream = fx.endpoint.transactions().await?;
    let sent = stream
        .requests
        .send(Request::Open(open.clone()).into())
        .await;
    ensure(sent.is_ok(), || {
        "the driver closed the stream at Open".into()
    })?;
    match stream.responses.next().await {
        Some(Ok(response)) if response.opened.is_some() => {}
        other => return Err(Failure(format!("expected Opened, got {other:?}"))),
    }
    for request in after_open {
        // The driver may already have ended the stream; its error is what matters.
        let _ = stream.requests.send(request.into()).await;
    }
    loop {
        match stream.responses.next().await {
            Some(Ok(_)) => continue,
            Some(Err(err)) => {
                let message = err.to_string();
                return ensure(message.contains(culprit), || {
                    format!(
                        "a misplaced {culprit} ended the stream with an error not naming it: {message}"
                    )
                });
            }
            None => {
                return Err(Failure(format!(
                    "a misplaced {culprit} ended the stream without an error"
                )));
            }
        }
    }
}
