//! The scenarios, in the order they run. Each one, and what it checks:
//!
//! | scenario | checks |
//! |---|---|
//! | `spec-schemas` | Spec returns endpoint and resource JSON schemas that compile and accept the configurations given to the suite |
//! | `validate-key-constraints` | Validate constrains every projection, requires the key field (FIELD_REQUIRED or LOCATION_REQUIRED), returns a resource path |
//! | `apply-dry-run-and-idempotence` | a dry run changes nothing (a second dry run and the real apply describe the same actions); re-applying keeps stored documents |
//! | `fresh-open` | a never-used materialization opens, runs an empty transaction and acknowledges |
//! | `rebuild-sentinel` | the Opened checkpoint of a never-committed range is empty or exactly the rebuild sentinel `f8 ff ff ff 0f 01` |
//! | `absent-keys-load-nothing` | loads of keys never stored return no documents |
//! | `store-commit-acknowledge` | new keys (exists=false) store, commit (DriverCommitted) and acknowledge |
//! | `pipelined-loads-read-committed` | Loads of T+1 sent before T's Acknowledge return exactly T's stores |
//! | `reopen-recovers-checkpoint` | a new stream recovers the runtime checkpoint committed last (or none: not authoritative) and loads exactly what was stored |
//! | `updates` | a document stored with exists=true replaces the previous one |
//! | `deletes` | a `null` document stored with exists=true removes the key (skipped if the driver refuses it) |
//! | `delta-updates` | a delta-updates binding takes stores (the same key twice, over two transactions) and is never loaded |
//! | `document-1-byte-value`, `document-1-mib`, `document-16-mib` | documents of those sizes round-trip byte for byte |
//! | `many-bindings` | one transaction stores into 8 bindings; loads return each binding's own documents |
//! | `second-open-fences-first` | after a second Open of the same range, the first instance's next commit fails, and its stores stay invisible |
//! | `out-of-order-requests-rejected` | Store right after Open, Commit before Prepare, and a second Open each end the stream with an error naming the message |

use super::fixture::{Fixture, REBUILD_SENTINEL, collection, doc};
use super::session::{Put, Session, Txn};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;
use sluice_doc::Schema;
use sluice_driver_sdk::machine::Request;
use sluice_driver_sdk::materialize::{
    self as m, constraint,
    transaction_request::{Open, Store},
};

/// Why a scenario did not pass.
pub enum Failure {
    Fail(String),
    Skip(String),
}

impl From<sluice_driver_sdk::Error> for Failure {
    fn from(err: sluice_driver_sdk::Error) -> Self {
        Failure::Fail(err.to_string())
    }
}

type Verdict = Result<(), Failure>;
type Scenario = for<'a> fn(&'a Fixture<'a>) -> BoxFuture<'a, Verdict>;

pub const ALL: [(&str, Scenario); 18] = [
    ("spec-schemas", |fx| Box::pin(spec_schemas(fx))),
    ("validate-key-constraints", |fx| {
        Box::pin(validate_key_constraints(fx))
    }),
    ("apply-dry-run-and-idempotence", |fx| {
        Box::pin(apply_dry_run_and_idempotence(fx))
    }),
    ("fresh-open", |fx| Box::pin(fresh_open(fx))),
    ("rebuild-sentinel", |fx| Box::pin(rebuild_sentinel(fx))),
    ("absent-keys-load-nothing", |fx| {
        Box::pin(absent_keys_load_nothing(fx))
    }),
    ("store-commit-acknowledge", |fx| {
        Box::pin(store_commit_acknowledge(fx))
    }),
    ("pipelined-loads-read-committed", |fx| {
        Box::pin(pipelined_loads_read_committed(fx))
    }),
    ("reopen-recovers-checkpoint", |fx| {
        Box::pin(reopen_recovers_checkpoint(fx))
    }),
    ("updates", |fx| Box::pin(updates(fx))),
    ("deletes", |fx| Box::pin(deletes(fx))),
    ("delta-updates", |fx| Box::pin(delta_updates(fx))),
    ("document-1-byte-value", |fx| {
        Box::pin(document_of(fx, None))
    }),
    ("document-1-mib", |fx| {
        Box::pin(document_of(fx, Some(1 << 20)))
    }),
    ("document-16-mib", |fx| {
        Box::pin(document_of(fx, Some(16 << 20)))
    }),
    ("many-bindings", |fx| Box::pin(many_bindings(fx))),
    ("second-open-fences-first", |fx| {
        Box::pin(second_open_fences_first(fx))
    }),
    ("out-of-order-requests-rejected", |fx| {
        Box::pin(out_of_order_requests_rejected(fx))
    }),
];

fn ensure(holds: bool, reason: impl FnOnce() -> String) -> Verdict {
    if holds {
        Ok(())
    } else {
        Err(Failure::Fail(reason()))
    }
}

/// Checks that `loaded` is exactly `expected` (both as (binding, document)).
fn ensure_loaded(what: &str, loaded: &[(u32, Value)], mut expected: Vec<(u32, Value)>) -> Verdict {
    expected.sort_by_cached_key(|(binding, doc)| (*binding, doc.to_string()));
    ensure(loaded == expected, || {
        format!(
            "{what}: loaded {}, expected {}",
            show(loaded),
            show(&expected)
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

fn loads(ids: impl IntoIterator<Item = i64>) -> Vec<(u32, i64)> {
    ids.into_iter().map(|id| (0, id)).collect()
}

/// Applies one binding and opens a session of the whole range.
async fn open_one(fx: &Fixture<'_>) -> Result<Session, Failure> {
    let spec = fx.setup(1).await?;
    Ok(Session::open(fx, &spec).await?)
}

/// Commits `stores`, loading nothing, with the fixture's checkpoint `n`.
async fn commit(fx: &Fixture<'_>, session: &mut Session, n: u32, stores: Vec<Put>) -> Verdict {
    let txn = Txn {
        stores,
        checkpoint: fx.checkpoint(n),
        ..Txn::default()
    };
    session.run(txn).await?;
    Ok(())
}

/// Loads `ids` of binding 0 in a transaction that stores nothing.
async fn load(
    session: &mut Session,
    ids: impl IntoIterator<Item = i64>,
) -> Result<Vec<(u32, Value)>, Failure> {
    let txn = Txn {
        loads: loads(ids),
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
            .map_err(|err| Failure::Fail(format!("the {what} schema is not JSON: {err}")))?;
        ensure(schema.is_object(), || {
            format!("the {what} schema is not an object: {schema}")
        })?;
        let schema = Schema::compile(&schema)
            .map_err(|err| Failure::Fail(format!("the {what} schema does not compile: {err}")))?;
        schema.validate(&instance).map_err(|err| {
            Failure::Fail(format!(
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
        }],
    };
    let response = fx.endpoint.validate(request).await?;
    let [binding] = response.bindings.as_slice() else {
        return Err(Failure::Fail(format!(
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

async fn apply_dry_run_and_idempotence(fx: &Fixture<'_>) -> Verdict {
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
    })?;
    let mut session = Session::open(fx, &spec).await?;
    let stores = vec![put(1, "kept", false)];
    commit(fx, &mut session, 1, stores).await?;
    session.close().await?;
    fx.apply(&spec, false).await?;
    let mut session = Session::open(fx, &spec).await?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded(
        "after re-applying the same spec",
        &loaded,
        vec![(0, doc(1, "kept"))],
    )
}

async fn fresh_open(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    session
        .run(Txn {
            checkpoint: fx.checkpoint(1),
            ..Txn::default()
        })
        .await?;
    Ok(session.close().await?)
}

async fn rebuild_sentinel(fx: &Fixture<'_>) -> Verdict {
    let session = open_one(fx).await?;
    let checkpoint = &session.opened.flow_checkpoint;
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
    let stores = (1..=3).map(|id| put(id, "new", false)).collect();
    session
        .run(Txn {
            loads: loads(1..=3),
            stores,
            checkpoint: fx.checkpoint(1),
            ..Txn::default()
        })
        .await?;
    Ok(session.close().await?)
}

async fn pipelined_loads_read_committed(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    let stores = (1..=3).map(|id| put(id, "first", false)).collect();
    commit(fx, &mut session, 1, stores).await?;
    let pipelined = Txn {
        loads: loads(1..=4),
        loads_first: true,
        checkpoint: fx.checkpoint(2),
        ..Txn::default()
    };
    let loaded = session.run(pipelined).await?;
    let expected = (1..=3).map(|id| (0, doc(id, "first"))).collect();
    ensure_loaded("loads sent before the prior Acknowledge", &loaded, expected)?;
    Ok(session.close().await?)
}

async fn reopen_recovers_checkpoint(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut session = Session::open(fx, &spec).await?;
    let stores = vec![put(1, "one", false), put(2, "two", false)];
    commit(fx, &mut session, 1, stores).await?;
    let stores = vec![put(3, "three", false)];
    commit(fx, &mut session, 2, stores).await?;
    session.close().await?;

    let mut session = Session::open(fx, &spec).await?;
    let recovered = &session.opened.flow_checkpoint;
    let committed = fx.checkpoint(2);
    ensure(recovered.is_empty() || *recovered == committed, || {
        format!(
            "reopened with checkpoint {:?}, but the last one committed was {:?}",
            String::from_utf8_lossy(recovered),
            String::from_utf8_lossy(&committed)
        )
    })?;
    let loaded = load(&mut session, 1..=4).await?;
    let expected = vec![(0, doc(1, "one")), (0, doc(2, "two")), (0, doc(3, "three"))];
    ensure_loaded("after reopening", &loaded, expected)?;
    Ok(session.close().await?)
}

async fn updates(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    commit(fx, &mut session, 1, vec![put(1, "before", false)]).await?;
    let update = Txn {
        loads: loads([1]),
        stores: vec![put(1, "after", true)],
        checkpoint: fx.checkpoint(2),
        ..Txn::default()
    };
    let loaded = session.run(update).await?;
    ensure_loaded("before the update", &loaded, vec![(0, doc(1, "before"))])?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded("after the update", &loaded, vec![(0, doc(1, "after"))])?;
    Ok(session.close().await?)
}

async fn deletes(fx: &Fixture<'_>) -> Verdict {
    let mut session = open_one(fx).await?;
    let stores = vec![put(1, "doomed", false), put(2, "kept", false)];
    commit(fx, &mut session, 1, stores).await?;
    let delete = Put {
        binding: 0,
        id: 1,
        doc: Value::Null,
        exists: true,
    };
    let txn = Txn {
        loads: loads([1]),
        stores: vec![delete],
        checkpoint: fx.checkpoint(2),
        ..Txn::default()
    };
    if let Err(err) = session.run(txn).await {
        return Err(Failure::Skip(format!(
            "the driver refused a null document (deletion): {err}"
        )));
    }
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
    let mut session = Session::open(fx, &spec).await?;
    let stores = vec![put(1, "standard", false), delta("a"), delta("b")];
    commit(fx, &mut session, 1, stores).await?;
    let txn = Txn {
        loads: loads([1]),
        stores: vec![delta("c")],
        checkpoint: fx.checkpoint(2),
        ..Txn::default()
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
    commit(fx, &mut session, 1, vec![put(1, &value, false)]).await?;
    let loaded = load(&mut session, [1]).await?;
    ensure_loaded("the stored document", &loaded, vec![(0, doc(1, &value))])?;
    Ok(session.close().await?)
}

async fn many_bindings(fx: &Fixture<'_>) -> Verdict {
    const BINDINGS: u32 = 8;
    let spec = fx.setup(BINDINGS as usize).await?;
    let mut session = Session::open(fx, &spec).await?;
    // Key 1 is in every binding with the binding's own value; key 100 + b only in b.
    let stored = |binding: u32| {
        [
            (binding, doc(1, &format!("b{binding}"))),
            (binding, doc(100 + i64::from(binding), "own")),
        ]
    };
    let stores = (0..BINDINGS)
        .flat_map(stored)
        .map(|(binding, doc)| Put {
            binding,
            id: doc["id"].as_i64().unwrap_or_default(),
            doc,
            exists: false,
        })
        .collect();
    commit(fx, &mut session, 1, stores).await?;
    let keys = (0..BINDINGS).flat_map(|binding| {
        std::iter::once(1)
            .chain(100..100 + i64::from(BINDINGS))
            .map(move |id| (binding, id))
    });
    let loaded = session
        .run(Txn {
            loads: keys.collect(),
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

async fn second_open_fences_first(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let mut first = Session::open(fx, &spec).await?;
    commit(fx, &mut first, 1, vec![put(1, "first", false)]).await?;
    let mut second = Session::open(fx, &spec).await?;
    let zombie = Txn {
        stores: vec![put(2, "zombie", false)],
        checkpoint: fx.checkpoint(2),
        ..Txn::default()
    };
    ensure(first.run(zombie).await.is_err(), || {
        "the first instance committed after a second Open of its range".into()
    })?;
    let loaded = second
        .run(Txn {
            loads: loads([1, 2]),
            checkpoint: fx.checkpoint(3),
            ..Txn::default()
        })
        .await?;
    ensure_loaded(
        "after the fenced commit",
        &loaded,
        vec![(0, doc(1, "first"))],
    )?;
    Ok(second.close().await?)
}

async fn out_of_order_requests_rejected(fx: &Fixture<'_>) -> Verdict {
    let spec = fx.setup(1).await?;
    let open = fx.open(&spec);
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
        other => return Err(Failure::Fail(format!("expected Opened, got {other:?}"))),
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
                return Err(Failure::Fail(format!(
                    "a misplaced {culprit} ended the stream without an error"
                )));
            }
        }
    }
}
