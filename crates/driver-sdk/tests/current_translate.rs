//! The translation between the seed's protocol and Flow's current one, both ways: whole
//! transactions, the checkpoints each side carries, and the order violations, named in
//! the current protocol's words where the current peer is at fault.

use prost::Message;
use serde_json::json;
use sluice_conformance::messages;
use sluice_doc::tuple::pack_key;
use sluice_driver_sdk::current::translate::{
    self as t, ClientTranslator, ServerTranslator, Translated, Unary,
};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::machine::REBUILD_SENTINEL;
use sluice_driver_sdk::materialize::{
    self as m, TransactionRequest, TransactionResponse, transaction_request as rq,
    transaction_response as rs,
};
use sluice_driver_sdk::{LoadedSink, Peer};
use sluice_proto::current::{consumer, flow as cf, materialize as cm};

// ---- seed messages

fn seed_spec() -> flow::MaterializationSpec {
    messages::spec("acme/m", r#"{"path":null}"#, &[("t", false), ("d", true)])
}

fn open() -> TransactionRequest {
    TransactionRequest {
        open: Some(messages::open(&seed_spec(), 0x10, 0x20)),
        ..Default::default()
    }
}

fn acknowledge() -> TransactionRequest {
    TransactionRequest {
        acknowledge: Some(rq::Acknowledge {}),
        ..Default::default()
    }
}

fn prepare(checkpoint: &[u8]) -> TransactionRequest {
    TransactionRequest {
        prepare: Some(rq::Prepare {
            flow_checkpoint: checkpoint.to_vec(),
        }),
        ..Default::default()
    }
}

fn commit() -> TransactionRequest {
    TransactionRequest {
        commit: Some(rq::Commit::default()),
        ..Default::default()
    }
}

fn key(id: i64) -> Vec<u8> {
    pack_key(&[json!(id), json!("k")])
}

// ---- current messages

fn current_request(set: impl FnOnce(&mut cm::Request)) -> cm::Request {
    let mut r = cm::Request::default();
    set(&mut r);
    r
}

fn current_response(set: impl FnOnce(&mut cm::Response)) -> cm::Response {
    let mut r = cm::Response::default();
    set(&mut r);
    r
}

fn opened(checkpoint: Option<consumer::Checkpoint>) -> cm::Response {
    current_response(|r| {
        r.opened = Some(cm::response::Opened {
            runtime_checkpoint: checkpoint,
            disable_load_optimization: false,
        })
    })
}

fn state(json: &str, merge_patch: bool) -> cf::ConnectorState {
    cf::ConnectorState {
        updated_json: json.as_bytes().to_vec(),
        merge_patch,
    }
}

fn acknowledged(state: Option<cf::ConnectorState>) -> cm::Response {
    current_response(|r| r.acknowledged = Some(cm::response::Acknowledged { state }))
}

fn seed_acknowledged(json: &str) -> TransactionResponse {
    TransactionResponse {
        acknowledged: Some(rs::Acknowledged {
            driver_checkpoint: Some(flow::DriverCheckpoint {
                driver_checkpoint_json: json.as_bytes().to_vec(),
                rfc7396_merge_patch: true,
            }),
        }),
        ..Default::default()
    }
}

fn no_change() -> flow::DriverCheckpoint {
    flow::DriverCheckpoint {
        driver_checkpoint_json: b"{}".to_vec(),
        rfc7396_merge_patch: true,
    }
}

fn sent(t: Translated<cm::Request, TransactionResponse>) -> Vec<cm::Request> {
    assert!(t.back.is_empty(), "nothing handed back: {:?}", t.back);
    t.out
}

fn one<T: std::fmt::Debug>(mut v: Vec<T>) -> T {
    assert_eq!(v.len(), 1, "{v:?}");
    v.pop().unwrap()
}

/// Runs the client translator up to the load phase of transaction 1.
fn client_opened() -> ClientTranslator {
    let mut c = ClientTranslator::new();
    c.request(open()).unwrap();
    c.response(opened(None)).unwrap();
    c
}

#[test]
fn client_translates_a_whole_transaction_and_the_next() {
    let mut c = ClientTranslator::new();

    let o = one(sent(c.request(open()).unwrap())).open.unwrap();
    let range = o.range.unwrap();
    assert_eq!((range.key_begin, range.key_end), (0x10, 0x20));
    assert_eq!((range.r_clock_begin, range.r_clock_end), (0, u32::MAX));
    assert_eq!(o.state_json, b"{}");
    let spec = o.materialization.unwrap();
    assert_eq!(spec.name, "acme/m");
    assert_eq!(spec.config_json, br#"{"path":null}"#);
    assert_eq!(spec.bindings[0].resource_config_json, br#"{"table":"t"}"#);
    assert_eq!(spec.bindings[0].state_key, "t");
    assert!(spec.bindings[1].delta_updates);

    let o = one(c.response(opened(None)).unwrap()).opened.unwrap();
    assert!(o.flow_checkpoint.is_empty(), "none: the runtime's own");

    // Acknowledge, then Acknowledged.
    one(sent(c.request(acknowledge()).unwrap()))
        .acknowledge
        .unwrap();
    let acked = c
        .response(acknowledged(Some(state(r#"{"a":1}"#, true))))
        .unwrap();
    assert_eq!(acked, vec![seed_acknowledged(r#"{"a":1}"#)]);

    // A Load of two keys is two Loads.
    let load = messages::load(0, &[&key(1), &key(2)]);
    let loads = sent(
        c.request(TransactionRequest {
            load: Some(load),
            ..Default::default()
        })
        .unwrap(),
    );
    let loads: Vec<_> = loads.into_iter().map(|r| r.load.unwrap()).collect();
    assert_eq!(loads.len(), 2);
    assert_eq!(loads[0].key_packed, key(1));
    assert_eq!(loads[0].key_json, br#"[1,"k"]"#);
    assert_eq!(loads[1].key_json, br#"[2,"k"]"#);

    let loaded = current_response(|r| {
        r.loaded = Some(cm::response::Loaded {
            binding: 0,
            doc_json: br#"{"id":1}"#.to_vec(),
        })
    });
    let loaded = one(c.response(loaded).unwrap()).loaded.unwrap();
    assert_eq!(loaded.binding, 0);
    let docs: Vec<_> = sluice_driver_sdk::arena::loaded_docs(&loaded)
        .map(Result::unwrap)
        .collect();
    assert_eq!(docs, [br#"{"id":1}"#]);

    // Prepare is Flush; Flushed without state is no change.
    one(sent(c.request(prepare(b"cp1")).unwrap()))
        .flush
        .unwrap();
    let flushed = current_response(|r| r.flushed = Some(cm::response::Flushed { state: None }));
    assert_eq!(
        one(c.response(flushed).unwrap()).prepared.unwrap(),
        no_change()
    );

    // A Store of two documents, one a deletion.
    let store = messages::store(
        0,
        &[(&key(1), r#"{"id":1}"#, true), (&key(2), "null", true)],
    );
    let stores = sent(
        c.request(TransactionRequest {
            store: Some(store),
            ..Default::default()
        })
        .unwrap(),
    );
    let stores: Vec<_> = stores.into_iter().map(|r| r.store.unwrap()).collect();
    assert_eq!(stores.len(), 2);
    assert_eq!(stores[0].key_json, br#"[1,"k"]"#);
    assert_eq!(stores[0].values_json, b"[]");
    assert_eq!(stores[0].doc_json, br#"{"id":1}"#);
    assert!(stores[0].exists && !stores[0].delete);
    assert!(stores[1].exists && stores[1].delete);

    // Commit is StartCommit with Prepare's checkpoint, wrapped.
    let start = one(sent(c.request(commit()).unwrap()))
        .start_commit
        .unwrap();
    assert_eq!(
        start.runtime_checkpoint,
        Some(t::wrap_checkpoint(b"cp1".to_vec()))
    );
    let started = current_response(|r| {
        r.started_commit = Some(cm::response::StartedCommit {
            state: Some(state(r#"{"b":2}"#, false)),
        })
    });
    let committed = one(c.response(started).unwrap()).driver_committed.unwrap();
    assert_eq!(
        committed.driver_checkpoint,
        Some(flow::DriverCheckpoint {
            driver_checkpoint_json: br#"{"b":2}"#.to_vec(),
            rfc7396_merge_patch: false,
        })
    );

    // Transaction 2: the connector's Acknowledged comes first, and is held until the
    // runtime's Acknowledge, which hands it back.
    assert_eq!(c.response(acknowledged(None)).unwrap(), vec![]);
    let t2 = c.request(acknowledge()).unwrap();
    one(t2.out).acknowledge.unwrap();
    assert_eq!(
        one(t2.back).acknowledged.unwrap(),
        rs::Acknowledged {
            driver_checkpoint: None
        }
    );

    one(sent(c.request(prepare(b"cp2")).unwrap()))
        .flush
        .unwrap();
    let flushed = current_response(|r| {
        r.flushed = Some(cm::response::Flushed {
            state: Some(state(r#"{"c":null}"#, true)),
        })
    });
    let prepared = one(c.response(flushed).unwrap()).prepared.unwrap();
    assert_eq!(prepared.driver_checkpoint_json, br#"{"c":null}"#);
    assert!(prepared.rfc7396_merge_patch);
    // Commit's own checkpoint (the extension), when set, replaces Prepare's.
    let commit_cp = TransactionRequest {
        commit: Some(rq::Commit {
            flow_checkpoint: b"cp2'".to_vec(),
        }),
        ..Default::default()
    };
    let start = one(sent(c.request(commit_cp).unwrap()))
        .start_commit
        .unwrap();
    assert_eq!(
        start.runtime_checkpoint,
        Some(t::wrap_checkpoint(b"cp2'".to_vec()))
    );
}

#[test]
fn opened_checkpoints_unwrap_to_the_seeds() {
    let cases: [(Option<consumer::Checkpoint>, &[u8]); 4] = [
        (None, b""),
        (Some(consumer::Checkpoint::default()), b""),
        (
            Some(consumer::Checkpoint {
                rebuild_from_zero: true,
                ..Default::default()
            }),
            &REBUILD_SENTINEL,
        ),
        (Some(t::wrap_checkpoint(b"ours".to_vec())), b"ours"),
    ];
    for (checkpoint, want) in cases {
        let mut c = ClientTranslator::new();
        c.request(open()).unwrap();
        let o = one(c.response(opened(checkpoint.clone())).unwrap())
            .opened
            .unwrap();
        assert_eq!(o.flow_checkpoint, want, "{checkpoint:?}");
    }
}

#[test]
fn a_foreign_checkpoint_at_opened_is_the_connectors_violation() {
    let foreign = consumer::Checkpoint {
        sources: [(
            "a/journal".to_string(),
            consumer::checkpoint::Source::default(),
        )]
        .into(),
        ..Default::default()
    };
    let mut c = ClientTranslator::new();
    c.request(open()).unwrap();
    let err = c.response(opened(Some(foreign))).unwrap_err();
    assert_eq!(err.peer, Peer::Driver);
    assert!(
        err.got.contains("Opened") && err.got.contains("a/journal"),
        "{err}"
    );
}

#[test]
fn a_second_acknowledged_is_the_connectors_violation() {
    let mut c = client_opened();
    c.response(acknowledged(None)).unwrap();
    let err = c.response(acknowledged(None)).unwrap_err();
    assert_eq!(err.peer, Peer::Driver);
    assert!(err.got.contains("second Acknowledged"), "{err}");

    // After the runtime's Acknowledge released it, too.
    let mut c = client_opened();
    c.request(acknowledge()).unwrap();
    c.response(acknowledged(None)).unwrap();
    let err = c.response(acknowledged(None)).unwrap_err();
    assert!(err.got.contains("second Acknowledged"), "{err}");
}

#[test]
fn acknowledged_before_started_commit_is_the_connectors_violation() {
    let mut c = client_opened();
    c.request(acknowledge()).unwrap();
    c.response(acknowledged(None)).unwrap();
    c.request(prepare(b"cp")).unwrap();
    c.response(current_response(|r| {
        r.flushed = Some(cm::response::Flushed { state: None })
    }))
    .unwrap();
    c.request(commit()).unwrap();
    let err = c.response(acknowledged(None)).unwrap_err();
    assert_eq!(err.peer, Peer::Driver);
    assert_eq!(err.got, "Acknowledged before StartedCommit");
}

#[test]
fn client_refuses_prepare_before_the_acknowledged_arrived() {
    let mut c = client_opened();
    c.request(acknowledge()).unwrap();
    let err = c.request(prepare(b"cp")).unwrap_err();
    assert_eq!(err.peer, Peer::Runtime);
    assert_eq!(err.got, "Prepare");
}

// ---- the driver side

fn current_open() -> cm::Request {
    current_request(|r| {
        r.open = Some(cm::request::Open {
            materialization: Some(t::spec_to_current(seed_spec())),
            version: "v1".into(),
            range: Some(cf::RangeSpec {
                key_begin: 1,
                key_end: 2,
                r_clock_begin: 0,
                r_clock_end: u32::MAX,
            }),
            state_json: br#"{"s":1}"#.to_vec(),
        })
    })
}

fn c_acknowledge() -> cm::Request {
    current_request(|r| r.acknowledge = Some(cm::request::Acknowledge {}))
}

fn c_flush() -> cm::Request {
    current_request(|r| r.flush = Some(cm::request::Flush {}))
}

fn c_load(id: i64) -> cm::Request {
    current_request(|r| {
        r.load = Some(cm::request::Load {
            binding: 0,
            key_json: Vec::new(),
            key_packed: key(id),
        })
    })
}

fn c_store(id: i64, doc: &str, delete: bool) -> cm::Request {
    c_store_exists(id, doc, delete, true)
}

fn c_store_exists(id: i64, doc: &str, delete: bool, exists: bool) -> cm::Request {
    current_request(|r| {
        r.store = Some(cm::request::Store {
            binding: 0,
            key_packed: key(id),
            values_packed: pack_key(&[json!("v")]),
            doc_json: doc.as_bytes().to_vec(),
            exists,
            delete,
            ..Default::default()
        })
    })
}

fn c_start_commit(cp: consumer::Checkpoint) -> cm::Request {
    current_request(|r| {
        r.start_commit = Some(cm::request::StartCommit {
            runtime_checkpoint: Some(cp),
        })
    })
}

fn seed(t: Translated<TransactionRequest, cm::Response>) -> TransactionRequest {
    assert!(t.back.is_empty(), "{:?}", t.back);
    one(t.out)
}

fn seed_response(set: impl FnOnce(&mut TransactionResponse)) -> TransactionResponse {
    let mut r = TransactionResponse::default();
    set(&mut r);
    r
}

/// Runs the server translator into the load phase with Acknowledged sent.
fn server_acknowledged() -> ServerTranslator {
    let mut s = ServerTranslator::new();
    s.request(current_open()).unwrap();
    s.response(seed_response(|r| r.opened = Some(rs::Opened::default())))
        .unwrap();
    s.request(c_acknowledge()).unwrap();
    s.response(seed_response(|r| {
        r.acknowledged = Some(rs::Acknowledged::default())
    }))
    .unwrap();
    s
}

#[test]
fn server_translates_a_whole_transaction_and_the_next() {
    let mut s = ServerTranslator::new();
    let o = seed(s.request(current_open()).unwrap()).open.unwrap();
    assert_eq!((o.key_begin, o.key_end), (1, 2));
    assert_eq!(o.driver_checkpoint_json, br#"{"s":1}"#);
    assert_eq!(o.materialization.unwrap().bindings, seed_spec().bindings);

    let o = one(s
        .response(seed_response(|r| r.opened = Some(rs::Opened::default())))
        .unwrap());
    assert_eq!(o.opened.unwrap().runtime_checkpoint, None);

    seed(s.request(c_acknowledge()).unwrap())
        .acknowledge
        .unwrap();
    // Loads are held, and packed into one seed Load.
    assert!(s.request(c_load(1)).unwrap().out.is_empty());
    assert!(s.request(c_load(2)).unwrap().out.is_empty());
    let acked = s.response(seed_response(|r| {
        r.acknowledged = Some(rs::Acknowledged::default())
    }));
    assert_eq!(one(acked.unwrap()).acknowledged.unwrap().state, None);

    // A seed Loaded of two documents is two Loaded.
    let mut builder = sluice_driver_sdk::arena::LoadedBuilder::new();
    builder.push(0, br#"{"id":1}"#);
    builder.push(0, br#"{"id":2}"#);
    let loaded = one(builder.finish());
    let loaded = s
        .response(seed_response(|r| r.loaded = Some(loaded)))
        .unwrap();
    let docs: Vec<_> = loaded
        .into_iter()
        .map(|r| r.loaded.unwrap().doc_json)
        .collect();
    assert_eq!(docs, [br#"{"id":1}"#.to_vec(), br#"{"id":2}"#.to_vec()]);

    // Flush sends the held Loads, then a Prepare without a checkpoint.
    let flush = s.request(c_flush()).unwrap();
    assert!(flush.back.is_empty());
    let [load, p] = <[TransactionRequest; 2]>::try_from(flush.out).unwrap();
    let load = load.load.unwrap();
    let keys: Vec<_> = sluice_driver_sdk::arena::load_keys(&load)
        .map(Result::unwrap)
        .collect();
    assert_eq!(keys, [key(1).as_slice(), key(2).as_slice()]);
    assert!(p.prepare.unwrap().flow_checkpoint.is_empty());
    // No change is Flushed without state.
    let flushed = one(s
        .response(seed_response(|r| r.prepared = Some(no_change())))
        .unwrap());
    assert_eq!(flushed.flushed.unwrap().state, None);

    // Stores are held too, and packed into one seed Store sent before the Commit.
    assert!(
        s.request(c_store(1, r#"{"id":1}"#, false))
            .unwrap()
            .out
            .is_empty()
    );
    let deletion = c_store(2, r#"{"_meta":{"op":"d"}}"#, true);
    assert!(s.request(deletion).unwrap().out.is_empty());

    // StartCommit's checkpoint rides on the seed Commit, encoded.
    let cp = consumer::Checkpoint {
        sources: [(
            "j".to_string(),
            consumer::checkpoint::Source {
                read_through: 7,
                producers: vec![],
            },
        )]
        .into(),
        ..Default::default()
    };
    let start = s.request(c_start_commit(cp.clone())).unwrap();
    let [store, c] = <[TransactionRequest; 2]>::try_from(start.out).unwrap();
    let store = store.store.unwrap();
    let docs: Vec<_> = sluice_driver_sdk::arena::store_docs(&store)
        .map(Result::unwrap)
        .collect();
    assert_eq!(docs.len(), 2);
    assert_eq!(
        (docs[0].key, docs[0].doc, docs[0].exists),
        (key(1).as_slice(), br#"{"id":1}"#.as_slice(), true)
    );
    assert_eq!(docs[0].values, pack_key(&[json!("v")]));
    assert_eq!(docs[1].doc, b"null", "a deletion is a null document");
    let c = c.commit.unwrap();
    assert_eq!(
        consumer::Checkpoint::decode(c.flow_checkpoint.as_slice()).unwrap(),
        cp
    );
    // Loads of the next transaction may come before StartedCommit.
    assert!(s.request(c_load(3)).unwrap().out.is_empty());
    let committed = seed_response(|r| {
        r.driver_committed = Some(rs::DriverCommitted {
            driver_checkpoint: Some(flow::DriverCheckpoint {
                driver_checkpoint_json: br#"{"x":1}"#.to_vec(),
                rfc7396_merge_patch: true,
            }),
        })
    });
    let started = one(s.response(committed).unwrap()).started_commit.unwrap();
    assert_eq!(started.state, Some(state(r#"{"x":1}"#, true)));

    // Transaction 2 begins with its Acknowledge, after the Load held before it.
    let ack = s.request(c_acknowledge()).unwrap().out;
    let [load, ack] = <[TransactionRequest; 2]>::try_from(ack).unwrap();
    assert_eq!(load.load.unwrap().arena, key(3));
    ack.acknowledge.unwrap();
}

#[test]
fn server_opened_decodes_the_checkpoint_the_driver_kept() {
    let kept = t::wrap_checkpoint(b"x".to_vec());
    let cases = [
        (
            REBUILD_SENTINEL.to_vec(),
            Some(consumer::Checkpoint {
                rebuild_from_zero: true,
                ..Default::default()
            }),
        ),
        (kept.encode_to_vec(), Some(kept)),
        (Vec::new(), None),
    ];
    for (bytes, want) in cases {
        let mut s = ServerTranslator::new();
        s.request(current_open()).unwrap();
        let o = s.response(seed_response(|r| {
            r.opened = Some(rs::Opened {
                flow_checkpoint: bytes.clone(),
            })
        }));
        assert_eq!(
            one(o.unwrap()).opened.unwrap().runtime_checkpoint,
            want,
            "{bytes:?}"
        );
        // The sentinel goes back out as the same bytes.
    }
    assert_eq!(
        consumer::Checkpoint {
            rebuild_from_zero: true,
            ..Default::default()
        }
        .encode_to_vec(),
        REBUILD_SENTINEL
    );

    let mut s = ServerTranslator::new();
    s.request(current_open()).unwrap();
    let err = s
        .response(seed_response(|r| {
            r.opened = Some(rs::Opened {
                flow_checkpoint: vec![0xff],
            })
        }))
        .unwrap_err();
    assert_eq!(err.peer, Peer::Driver);
    assert!(err.expected.contains("consumer.Checkpoint"), "{err}");
}

#[test]
fn server_refuses_requests_out_of_the_current_order_naming_them() {
    type Case = (
        &'static str,
        fn() -> ServerTranslator,
        fn() -> cm::Request,
        &'static str,
    );
    let cases: [Case; 7] = [
        (
            "Load before Open",
            ServerTranslator::new,
            || c_load(1),
            "Open",
        ),
        (
            "Acknowledge before Opened",
            || {
                let mut s = ServerTranslator::new();
                s.request(current_open()).unwrap();
                s
            },
            c_acknowledge,
            "no request before Opened",
        ),
        (
            "a second Open",
            server_acknowledged,
            current_open,
            "Load or Flush",
        ),
        (
            "Flush before Acknowledge",
            || {
                let mut s = ServerTranslator::new();
                s.request(current_open()).unwrap();
                s.response(seed_response(|r| r.opened = Some(rs::Opened::default())))
                    .unwrap();
                s
            },
            c_flush,
            "Acknowledge or Load",
        ),
        (
            "Flush before Acknowledged was sent",
            || {
                let mut s = ServerTranslator::new();
                s.request(current_open()).unwrap();
                s.response(seed_response(|r| r.opened = Some(rs::Opened::default())))
                    .unwrap();
                s.request(c_acknowledge()).unwrap();
                s
            },
            c_flush,
            "Load, or Flush once Acknowledged was sent",
        ),
        (
            "a second Acknowledge",
            server_acknowledged,
            c_acknowledge,
            "Load or Flush",
        ),
        (
            "Store before Flush",
            server_acknowledged,
            || c_store(1, "{}", false),
            "Load or Flush",
        ),
    ];
    for (case, state, request, expected) in cases {
        let mut s = state();
        let req = request();
        let err = s.request(req).unwrap_err();
        assert_eq!(err.peer, Peer::Runtime, "{case}");
        assert_eq!(err.expected, expected, "{case}");
        assert!(!err.got.is_empty(), "{case}");
    }

    // Between Flush and Flushed nothing; between Flushed and StartCommit only Store.
    let mut s = server_acknowledged();
    s.request(c_flush()).unwrap();
    let err = s.request(c_load(1)).unwrap_err();
    assert_eq!(
        (err.expected.as_str(), err.got.as_str()),
        ("no request before Flushed", "Load")
    );
    let mut s = server_acknowledged();
    s.request(c_flush()).unwrap();
    s.response(seed_response(|r| r.prepared = Some(no_change())))
        .unwrap();
    let err = s.request(c_load(1)).unwrap_err();
    assert_eq!(
        (err.expected.as_str(), err.got.as_str()),
        ("Store or StartCommit", "Load")
    );
    let err = ServerTranslator::new()
        .request(cm::Request::default())
        .unwrap_err();
    assert_eq!(err.got, "an empty Request");
}

// ---- unary calls and specs

#[test]
fn specs_survive_the_round_trip_through_the_current_protocol() {
    let mut spec = seed_spec();
    spec.endpoint_type = flow::EndpointType::Invalid as i32;
    spec.bindings[0].backfill = 2;
    spec.bindings[0].collection = Some(flow::CollectionSpec {
        collection: "acme/c".into(),
        key_ptrs: vec!["/id".into()],
        schema_json: r#"{"type":"object"}"#.into(),
        projections: vec![flow::Projection {
            ptr: "/id".into(),
            field: "id".into(),
            user_provided: true,
            is_primary_key: true,
            inference: Some(flow::Inference {
                types: vec!["integer".into()],
                must_exist: true,
                string: Some(flow::inference::String {
                    is_base64: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    spec.bindings[0].field_selection = Some(flow::FieldSelection {
        keys: vec!["id".into()],
        field_config_json: [("id".to_string(), "{}".to_string())].into(),
        ..Default::default()
    });
    let current = t::spec_to_current(spec.clone());
    assert_eq!(current.bindings[0].state_key, "t.v2");
    assert_eq!(t::spec_from_current(current), spec);
}

#[test]
fn state_keys_are_encoded_as_flows() {
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(t::state_key(&path(&["some", "path"]), 0), "some%2Fpath");
    assert_eq!(t::state_key(&path(&["a b"]), 1), "a%20b.v1");
    assert_eq!(t::state_key(&path(&["Tbl-1_x.y=z+é"]), 0), "Tbl-1_x.y=z+é");
}

#[test]
fn unary_calls_map_both_ways() {
    let spec = seed_spec();
    let apply = m::ApplyRequest {
        materialization: Some(spec.clone()),
        version: "v2".into(),
        driver_checkpoint_json: b"{}".to_vec(),
        ..Default::default()
    };
    let Unary::Apply(back) = t::unary_request(t::apply_request(apply.clone())).unwrap() else {
        panic!("an upsert")
    };
    assert_eq!(back.version, "v2");
    assert_eq!(back.materialization.unwrap().bindings, spec.bindings);

    // A deletion is an Apply of no bindings after the last spec.
    let Unary::ApplyDelete(back) = t::unary_request(t::apply_delete_request(apply)).unwrap() else {
        panic!("a deletion")
    };
    assert_eq!(back.version, "v2");
    assert_eq!(back.materialization.unwrap().bindings, spec.bindings);

    let spec_req = m::SpecRequest {
        endpoint_type: 0,
        endpoint_spec_json: "{}".into(),
    };
    assert_eq!(
        t::unary_request(t::spec_request(spec_req.clone())).unwrap(),
        Unary::Spec(spec_req)
    );
    let err = t::unary_request(c_flush()).unwrap_err();
    assert_eq!(err.got, "Flush");

    let spec_resp = m::SpecResponse {
        endpoint_spec_schema_json: "{}".into(),
        resource_spec_schema_json: r#"{"type":"object"}"#.into(),
        documentation_url: "https://docs".into(),
    };
    let current = t::spec_response(spec_resp.clone());
    assert_eq!(current.spec.as_ref().unwrap().protocol, 3032023);
    assert_eq!(t::spec_from(current.clone()).unwrap(), spec_resp);
    let mut old = current;
    old.spec.as_mut().unwrap().protocol = 3032022;
    let err = t::spec_from(old).unwrap_err();
    assert!(err.got.contains("3032022"), "{err}");
}

#[test]
fn constraint_types_shift_by_one_and_unsatisfiable_is_incompatible() {
    use m::constraint::Type;
    let types = [
        (
            Type::FieldRequired,
            cm::response::validated::constraint::Type::FieldRequired,
        ),
        (
            Type::LocationRequired,
            cm::response::validated::constraint::Type::LocationRequired,
        ),
        (
            Type::LocationRecommended,
            cm::response::validated::constraint::Type::LocationRecommended,
        ),
        (
            Type::FieldOptional,
            cm::response::validated::constraint::Type::FieldOptional,
        ),
        (
            Type::FieldForbidden,
            cm::response::validated::constraint::Type::FieldForbidden,
        ),
        (
            Type::Unsatisfiable,
            cm::response::validated::constraint::Type::Incompatible,
        ),
    ];
    for (seed_type, current_type) in types {
        let validated = m::ValidateResponse {
            bindings: vec![m::validate_response::Binding {
                constraints: [(
                    "f".to_string(),
                    m::Constraint {
                        r#type: seed_type as i32,
                        reason: "r".into(),
                    },
                )]
                .into(),
                resource_path: vec!["t".into()],
                delta_updates: false,
            }],
        };
        let current = t::validated_response(validated.clone());
        let c = &current.validated.as_ref().unwrap().bindings[0].constraints["f"];
        assert_eq!(c.r#type, current_type as i32, "{seed_type:?}");
        assert_eq!(t::validated_from(current).unwrap(), validated);
    }
    let invalid = current_response(|r| {
        r.validated = Some(cm::response::Validated {
            bindings: vec![cm::response::validated::Binding {
                constraints: [(
                    "f".to_string(),
                    cm::response::validated::Constraint::default(),
                )]
                .into(),
                ..Default::default()
            }],
        })
    });
    let err = t::validated_from(invalid).unwrap_err();
    assert!(err.got.contains("\"f\""), "{err}");
}

#[test]
fn applied_state_is_the_driver_checkpoint() {
    let applied = m::ApplyResponse {
        action_description: "created t".into(),
        driver_checkpoint: Some(flow::DriverCheckpoint {
            driver_checkpoint_json: br#"{"v":1}"#.to_vec(),
            rfc7396_merge_patch: false,
        }),
    };
    let current = t::applied_response(applied.clone());
    assert_eq!(
        current.applied.as_ref().unwrap().state,
        Some(state(r#"{"v":1}"#, false))
    );
    assert_eq!(t::applied_from(current).unwrap(), applied);
}

// ---- the checkpoint at commit, through the serve loop and an authoritative store

/// A current runtime's stream into Sluice's serve loop running `driver`, through the
/// server translator.
struct Served {
    translator: ServerTranslator,
    tx: tokio::sync::mpsc::Sender<sluice_driver_sdk::Result<TransactionRequest>>,
    rx: tokio::sync::mpsc::Receiver<TransactionResponse>,
    serving: tokio::task::JoinHandle<sluice_driver_sdk::Result<()>>,
}

impl Served {
    fn start(driver: &sluice_memory::MemoryDriver) -> Served {
        use futures::StreamExt;
        let (tx, requests) = tokio::sync::mpsc::channel(16);
        let (responses, rx) = tokio::sync::mpsc::channel(16);
        let requests = tokio_stream::wrappers::ReceiverStream::new(requests).boxed();
        let driver: std::sync::Arc<dyn sluice_driver_sdk::Driver> =
            std::sync::Arc::new(driver.clone());
        let serving = tokio::spawn(sluice_driver_sdk::serve::serve_transactions(
            driver, requests, responses,
        ));
        Served {
            translator: ServerTranslator::new(),
            tx,
            rx,
            serving,
        }
    }

    async fn send(&mut self, req: cm::Request) {
        for seed in self.translator.request(req).unwrap().out {
            self.tx.send(Ok(seed)).await.unwrap();
        }
    }

    async fn recv(&mut self) -> cm::Response {
        let Some(seed) = self.rx.recv().await else {
            let ended = (&mut self.serving).await.unwrap();
            panic!("the serve loop ended: {ended:?}");
        };
        one(self.translator.response(seed).unwrap())
    }
}

#[tokio::test]
async fn an_authoritative_store_commits_the_checkpoint_start_commit_gave() {
    let driver = sluice_memory::MemoryDriver::new();
    let open = || {
        let spec = messages::spec("acme/m", "{}", &[("t", false)]);
        current_request(|r| {
            r.open = Some(cm::request::Open {
                materialization: Some(t::spec_to_current(spec)),
                version: "v1".into(),
                range: Some(cf::RangeSpec {
                    key_begin: 0,
                    key_end: u32::MAX,
                    r_clock_begin: 0,
                    r_clock_end: u32::MAX,
                }),
                state_json: b"{}".to_vec(),
            })
        })
    };
    let cp = consumer::Checkpoint {
        sources: [(
            "j".to_string(),
            consumer::checkpoint::Source {
                read_through: 42,
                producers: vec![],
            },
        )]
        .into(),
        ..Default::default()
    };

    let mut s = Served::start(&driver);
    s.send(open()).await;
    assert_eq!(s.recv().await.opened.unwrap().runtime_checkpoint, None);
    s.send(c_acknowledge()).await;
    s.recv().await.acknowledged.unwrap();
    s.send(c_flush()).await;
    s.recv().await.flushed.unwrap();
    s.send(c_store_exists(1, r#"{"id":1}"#, false, false)).await;
    s.send(c_start_commit(cp.clone())).await;
    s.recv().await.started_commit.unwrap();
    drop(s.tx);
    s.serving.await.unwrap().unwrap();
    assert_eq!(
        driver.checkpoint("acme/m", 0, u32::MAX),
        Some(cp.encode_to_vec())
    );

    // A new stream recovers it at Opened.
    let mut s = Served::start(&driver);
    s.send(open()).await;
    assert_eq!(s.recv().await.opened.unwrap().runtime_checkpoint, Some(cp));
}

/// A Sluice runtime and a Sluice driver speaking the current protocol to each other see
/// the same transaction, and the checkpoint the driver stored at Commit comes back to
/// the runtime at Opened as the runtime committed it. Every current message between
/// them also goes through Flow's JSON codec, as over a stdio connector speaking JSON.
#[test]
fn a_sluice_runtime_and_driver_over_the_current_protocol_agree() {
    use sluice_driver_sdk::current::json;
    let mut client = ClientTranslator::new();
    let mut server = ServerTranslator::new();
    // Runtime → driver: each seed request through both translators.
    let to_driver =
        |c: &mut ClientTranslator, s: &mut ServerTranslator, req| -> Vec<TransactionRequest> {
            let t = c.request(req).unwrap();
            assert!(t.back.is_empty());
            t.out
                .into_iter()
                .map(|r| json::decode_request(&json::encode_request(&r)).unwrap())
                .flat_map(|r| s.request(r).unwrap().out)
                .collect()
        };
    // Driver → runtime.
    let to_runtime =
        |c: &mut ClientTranslator, s: &mut ServerTranslator, resp| -> Vec<TransactionResponse> {
            s.response(resp)
                .unwrap()
                .into_iter()
                .map(|r| json::decode_response(&json::encode_response(&r)).unwrap())
                .flat_map(|r| c.response(r).unwrap())
                .collect()
        };

    let o = one(to_driver(&mut client, &mut server, open()))
        .open
        .unwrap();
    assert_eq!(o.materialization.unwrap().bindings, seed_spec().bindings);
    assert_eq!((o.key_begin, o.key_end), (0x10, 0x20));

    // The driver recovers what it stored at an earlier Commit: the runtime's bytes.
    let stored = t::wrap_checkpoint(b"runtime cp 7".to_vec()).encode_to_vec();
    let o = to_runtime(
        &mut client,
        &mut server,
        seed_response(|r| {
            r.opened = Some(rs::Opened {
                flow_checkpoint: stored,
            })
        }),
    );
    assert_eq!(one(o).opened.unwrap().flow_checkpoint, b"runtime cp 7");

    one(to_driver(&mut client, &mut server, acknowledge()))
        .acknowledge
        .unwrap();
    let acked = seed_response(|r| r.acknowledged = Some(rs::Acknowledged::default()));
    one(to_runtime(&mut client, &mut server, acked))
        .acknowledged
        .unwrap();

    // The runtime's Load, one per key on the way, reaches the driver as it was sent.
    let load = messages::load(0, &[&key(1), &key(2)]);
    let request = TransactionRequest {
        load: Some(load.clone()),
        ..Default::default()
    };
    assert!(to_driver(&mut client, &mut server, request).is_empty());
    let flush = to_driver(&mut client, &mut server, prepare(b"runtime cp 8"));
    let [got, p] = <[TransactionRequest; 2]>::try_from(flush).unwrap();
    assert_eq!(got.load.unwrap(), load);
    assert!(
        p.prepare.unwrap().flow_checkpoint.is_empty(),
        "the current protocol has none at Flush"
    );
    let prepared = to_runtime(
        &mut client,
        &mut server,
        seed_response(|r| r.prepared = Some(no_change())),
    );
    assert_eq!(one(prepared).prepared.unwrap(), no_change());

    let store = messages::store(
        0,
        &[(&key(1), r#"{"id":1}"#, false), (&key(2), "null", true)],
    );
    let request = TransactionRequest {
        store: Some(store.clone()),
        ..Default::default()
    };
    assert!(to_driver(&mut client, &mut server, request).is_empty());
    // The Store reaches the driver as it was sent, and the driver commits what the
    // runtime prepared, given at Commit.
    let commit = to_driver(&mut client, &mut server, commit());
    let [got, c] = <[TransactionRequest; 2]>::try_from(commit).unwrap();
    assert_eq!(got.store.unwrap(), store);
    assert_eq!(
        c.commit.unwrap().flow_checkpoint,
        t::wrap_checkpoint(b"runtime cp 8".to_vec()).encode_to_vec()
    );
    let committed = seed_response(|r| r.driver_committed = Some(rs::DriverCommitted::default()));
    one(to_runtime(&mut client, &mut server, committed))
        .driver_committed
        .unwrap();
}
