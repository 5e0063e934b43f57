//! The protocol state machine, exhaustively: in every state, every message kind is
//! either accepted or rejected as the protocol says, and rejections name the peer, what
//! was expected and what arrived.

use sluice_conformance::messages;
use sluice_driver_sdk::Peer;
use sluice_driver_sdk::machine::{Machine, Request, Response};
use sluice_proto::flow;
use sluice_proto::materialize::{
    TransactionRequest, TransactionResponse,
    transaction_request::{Commit, Load, Prepare, Store},
    transaction_response::{Loaded, Opened},
};

/// One message on the wire, in either direction.
#[derive(Clone, Debug)]
enum Ev {
    Rq(Request),
    Rs(Response),
}

fn open() -> Ev {
    // Binding 0 is standard, binding 1 is delta-updates.
    let spec = messages::spec("m", "{}", &[("t", false), ("d", true)]);
    Ev::Rq(Request::Open(messages::open(&spec, 0, u32::MAX)))
}
fn opened() -> Ev {
    Ev::Rs(Response::Opened(Opened::default()))
}
fn ack() -> Ev {
    Ev::Rq(Request::Acknowledge)
}
fn acked() -> Ev {
    Ev::Rs(Response::Acknowledged(None))
}
fn load_of(binding: u32) -> Ev {
    Ev::Rq(Request::Load(Load {
        binding,
        ..Default::default()
    }))
}
fn load() -> Ev {
    load_of(0)
}
fn loaded_of(binding: u32) -> Ev {
    Ev::Rs(Response::Loaded(Loaded {
        binding,
        ..Default::default()
    }))
}
fn loaded() -> Ev {
    loaded_of(0)
}
fn prepare() -> Ev {
    Ev::Rq(Request::Prepare(Prepare::default()))
}
fn prepared() -> Ev {
    Ev::Rs(Response::Prepared(flow::DriverCheckpoint::default()))
}
fn store_of(binding: u32) -> Ev {
    Ev::Rq(Request::Store(Store {
        binding,
        ..Default::default()
    }))
}
fn store() -> Ev {
    store_of(0)
}
fn commit() -> Ev {
    Ev::Rq(Request::Commit)
}
fn committed() -> Ev {
    Ev::Rs(Response::DriverCommitted(None))
}

fn step(m: Machine, ev: &Ev) -> Result<Machine, sluice_driver_sdk::ProtocolError> {
    match ev {
        Ev::Rq(r) => m.on_request(r),
        Ev::Rs(r) => m.on_response(r),
    }
}

fn name(ev: &Ev) -> &'static str {
    match ev {
        Ev::Rq(r) => r.name(),
        Ev::Rs(r) => r.name(),
    }
}

fn run(events: &[Ev]) -> Machine {
    events.iter().fold(Machine::new(), |m, ev| {
        step(m, ev).unwrap_or_else(|e| panic!("{events:?}: {e}"))
    })
}

/// Every message kind, one of each.
fn all_kinds() -> Vec<Ev> {
    vec![
        open(),
        load(),
        prepare(),
        store(),
        commit(),
        ack(),
        opened(),
        loaded(),
        prepared(),
        committed(),
        acked(),
    ]
}

/// One state: how to reach it, the message kinds it accepts, and the `expected` text of
/// a rejected request and of a rejected response.
struct Case {
    state: &'static str,
    prefix: Vec<Ev>,
    accepted: &'static [&'static str],
    bad_request: &'static str,
    bad_response: &'static str,
}

fn case(
    state: &'static str,
    prefix: Vec<Ev>,
    accepted: &'static [&'static str],
    bad_request: &'static str,
    bad_response: &'static str,
) -> Case {
    Case {
        state,
        prefix,
        accepted,
        bad_request,
        bad_response,
    }
}

fn table() -> Vec<Case> {
    let t1 = vec![open(), opened()];
    let with = |extra: Vec<Ev>| [t1.clone(), extra].concat();
    let txn1 = with(vec![
        ack(),
        acked(),
        prepare(),
        prepared(),
        store(),
        commit(),
        committed(),
    ]);
    vec![
        case(
            "awaiting Open",
            vec![],
            &["Open"],
            "Open",
            "no response before Open",
        ),
        case(
            "awaiting Opened",
            vec![open()],
            &["Opened"],
            "no request before Opened",
            "Opened",
        ),
        case(
            "load phase, nothing sent",
            t1.clone(),
            &["Load", "Acknowledge"],
            "Acknowledge or Load",
            "no response before Acknowledge or Load",
        ),
        case(
            "load phase, loads sent, no Acknowledge",
            with(vec![load()]),
            &["Load", "Acknowledge", "Loaded"],
            "Acknowledge or Load",
            "Loaded",
        ),
        case(
            "load phase, Acknowledge sent",
            with(vec![ack()]),
            &["Load", "Acknowledged"],
            "Load, or Prepare once Acknowledged has arrived",
            "Acknowledged",
        ),
        case(
            "load phase, Acknowledge and loads sent",
            with(vec![load(), ack()]),
            &["Load", "Acknowledged", "Loaded"],
            "Load, or Prepare once Acknowledged has arrived",
            "Acknowledged or Loaded",
        ),
        case(
            "load phase, acknowledged",
            with(vec![ack(), acked()]),
            &["Load", "Prepare"],
            "Load or Prepare",
            "no response before Acknowledge or Load",
        ),
        case(
            "load phase, acknowledged, loads sent",
            with(vec![ack(), load(), acked()]),
            &["Load", "Prepare", "Loaded"],
            "Load or Prepare",
            "Loaded",
        ),
        case(
            "awaiting Prepared, no loads",
            with(vec![ack(), acked(), prepare()]),
            &["Prepared"],
            "no request before Prepared",
            "Prepared",
        ),
        case(
            "awaiting Prepared, loads sent",
            with(vec![ack(), load(), acked(), prepare()]),
            &["Prepared", "Loaded"],
            "no request before Prepared",
            "Loaded or Prepared",
        ),
        case(
            "store phase",
            with(vec![ack(), acked(), prepare(), prepared()]),
            &["Store", "Commit"],
            "Store or Commit",
            "no response before Commit",
        ),
        case(
            "store phase after stores",
            with(vec![ack(), acked(), prepare(), prepared(), store()]),
            &["Store", "Commit"],
            "Store or Commit",
            "no response before Commit",
        ),
        case(
            "awaiting DriverCommitted",
            with(vec![ack(), acked(), prepare(), prepared(), commit()]),
            &["DriverCommitted", "Load"],
            "no request but Load before DriverCommitted",
            "DriverCommitted",
        ),
        case(
            "awaiting DriverCommitted, Loads of transaction 2 sent",
            with(vec![
                ack(),
                acked(),
                prepare(),
                prepared(),
                commit(),
                load(),
            ]),
            &["DriverCommitted", "Load"],
            "no request but Load before DriverCommitted",
            "DriverCommitted",
        ),
        case(
            "load phase of transaction 2",
            txn1.clone(),
            &["Load", "Acknowledge"],
            "Acknowledge or Load",
            "no response before Acknowledge or Load",
        ),
        case(
            "load phase of transaction 2, its Loads sent before DriverCommitted",
            with(vec![
                ack(),
                acked(),
                prepare(),
                prepared(),
                commit(),
                load(),
                committed(),
            ]),
            &["Load", "Acknowledge", "Loaded"],
            "Acknowledge or Load",
            "Loaded",
        ),
        case(
            "transaction 2 acknowledged",
            [txn1, vec![ack(), acked()]].concat(),
            &["Load", "Prepare"],
            "Load or Prepare",
            "no response before Acknowledge or Load",
        ),
    ]
}

#[test]
fn every_message_kind_in_every_state_is_accepted_or_rejected_as_the_protocol_says() {
    let mut rejected = 0;
    for Case {
        state,
        prefix,
        accepted,
        bad_request,
        bad_response,
    } in table()
    {
        for ev in all_kinds() {
            let result = step(run(&prefix), &ev);
            let kind = name(&ev);
            match (accepted.contains(&kind), result) {
                (true, Ok(_)) => {}
                (true, Err(e)) => panic!("{state}: {kind} must be accepted, got {e}"),
                (false, Ok(_)) => panic!("{state}: {kind} must be rejected"),
                (false, Err(e)) => {
                    rejected += 1;
                    let (peer, expected) = match ev {
                        Ev::Rq(_) => (Peer::Runtime, bad_request),
                        Ev::Rs(_) => (Peer::Driver, bad_response),
                    };
                    assert_eq!(
                        (e.peer, e.expected.as_str(), e.got.as_str()),
                        (peer, expected, kind),
                        "{state}"
                    );
                }
            }
        }
    }
    // 17 states × 11 kinds, minus the 35 accepted pairs.
    assert_eq!(rejected, 17 * 11 - 35);
}

#[test]
fn the_error_message_names_peer_expectation_and_arrival() {
    let err = step(run(&[open(), opened()]), &prepare()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "protocol violation by the runtime: expected Acknowledge or Load, got Prepare"
    );
}

#[test]
fn pipelined_orders_are_accepted() {
    let orders: Vec<Vec<Ev>> = vec![
        // Acknowledge first, Loaded interleaved with Acknowledged, Loaded deferred to Prepare.
        vec![
            ack(),
            load(),
            loaded(),
            acked(),
            load(),
            prepare(),
            loaded(),
            prepared(),
        ],
        // Loads before Acknowledge, Acknowledged after all Loaded.
        vec![
            load(),
            load(),
            loaded(),
            ack(),
            load(),
            loaded(),
            acked(),
            prepare(),
            prepared(),
        ],
        // No loads at all.
        vec![ack(), acked(), prepare(), prepared()],
    ];
    for order in orders {
        let mut events = vec![open(), opened()];
        // Three transactions: each next one's loads are sent right after DriverCommitted,
        // before its Acknowledge (of the prior commit) and before Acknowledged.
        for _ in 0..3 {
            events.extend(order.iter().cloned());
            events.extend([store(), store_of(1), commit(), committed()]);
        }
        assert!(run(&events).may_close(), "{order:?}");
    }
}

#[test]
fn loads_of_the_next_transaction_may_follow_commit_and_their_loaded_driver_committed() {
    let committing = [
        open(),
        opened(),
        ack(),
        acked(),
        prepare(),
        prepared(),
        commit(),
        load(),
        load(),
    ];
    // Loaded of transaction 2 before DriverCommitted of 1 could not reflect 1's stores.
    let err = step(run(&committing), &loaded()).unwrap_err();
    assert_eq!(
        (err.peer, err.expected.as_str(), err.got.as_str()),
        (Peer::Driver, "DriverCommitted", "Loaded")
    );
    // The Acknowledge of 1 follows the runtime's commit, which follows DriverCommitted.
    let err = step(run(&committing), &ack()).unwrap_err();
    assert_eq!(err.expected, "no request but Load before DriverCommitted");
    // A delta-updates binding is never loaded, in this phase either.
    let err = step(run(&committing), &load_of(1)).unwrap_err();
    assert_eq!(err.got, "Load of delta-updates binding 1");
    assert_eq!(
        run(&committing).describe(),
        "awaiting DriverCommitted of transaction 1, with Loads of transaction 2 sent"
    );
    // Both Loads count for transaction 2: Loaded may follow until its Prepared.
    let after = [
        &committing[..],
        &[committed(), loaded(), ack(), acked(), prepare(), loaded()],
        &[prepared(), commit(), committed()],
    ]
    .concat();
    assert!(run(&after).may_close());
}

#[test]
fn second_acknowledge_in_one_transaction_is_rejected() {
    let err = step(run(&[open(), opened(), ack(), acked()]), &ack()).unwrap_err();
    assert_eq!((err.peer, err.got.as_str()), (Peer::Runtime, "Acknowledge"));
    let err = step(run(&[open(), opened(), ack()]), &ack()).unwrap_err();
    assert_eq!(err.got, "Acknowledge");
}

#[test]
fn loads_of_delta_or_unknown_bindings_are_rejected() {
    let loading = run(&[open(), opened()]);
    let err = step(loading.clone(), &load_of(1)).unwrap_err();
    assert_eq!(
        (err.peer, err.expected.as_str(), err.got.as_str()),
        (
            Peer::Runtime,
            "Load of a standard-updates binding",
            "Load of delta-updates binding 1"
        )
    );
    let err = step(loading, &load_of(2)).unwrap_err();
    assert_eq!(
        (err.expected.as_str(), err.got.as_str()),
        ("Load of a binding in 0..2", "Load of binding 2")
    );
}

#[test]
fn loaded_of_delta_or_unknown_bindings_is_rejected() {
    let loading = run(&[open(), opened(), load()]);
    let err = step(loading.clone(), &loaded_of(1)).unwrap_err();
    assert_eq!(
        (err.peer, err.got.as_str()),
        (Peer::Driver, "Loaded of delta-updates binding 1")
    );
    let err = step(loading, &loaded_of(7)).unwrap_err();
    assert_eq!(err.got, "Loaded of binding 7");
}

#[test]
fn store_of_unknown_binding_is_rejected_and_of_delta_binding_accepted() {
    let storing = run(&[open(), opened(), ack(), acked(), prepare(), prepared()]);
    run(&[
        open(),
        opened(),
        ack(),
        acked(),
        prepare(),
        prepared(),
        store_of(1),
    ]);
    let err = step(storing, &store_of(2)).unwrap_err();
    assert_eq!(err.got, "Store of binding 2");
}

#[test]
fn open_with_inverted_key_range_is_rejected() {
    let spec = messages::spec("m", "{}", &[("t", false)]);
    let err = Machine::new()
        .on_request(&Request::Open(messages::open(&spec, 10, 9)))
        .unwrap_err();
    assert_eq!(err.expected, "Open with key_begin <= key_end");
}

#[test]
fn request_and_response_must_have_exactly_one_field_set() {
    let err = Request::try_from(TransactionRequest::default()).unwrap_err();
    assert_eq!(
        (err.peer, err.got.as_str()),
        (Peer::Runtime, "an empty TransactionRequest")
    );
    let two = TransactionRequest {
        load: Some(Load::default()),
        commit: Some(Commit::default()),
        ..Default::default()
    };
    let err = Request::try_from(two).unwrap_err();
    assert_eq!(
        err.got,
        "a TransactionRequest with load and commit set together"
    );
    let err = Response::try_from(TransactionResponse::default()).unwrap_err();
    assert_eq!(
        (err.peer, err.got.as_str()),
        (Peer::Driver, "an empty TransactionResponse")
    );
}

#[test]
fn wire_conversions_round_trip() {
    for ev in all_kinds() {
        match ev {
            Ev::Rq(r) => assert_eq!(
                Request::try_from(TransactionRequest::from(r.clone())).unwrap(),
                r
            ),
            Ev::Rs(r) => assert_eq!(
                Response::try_from(TransactionResponse::from(r.clone())).unwrap(),
                r
            ),
        }
    }
}

#[test]
fn driver_checkpoints_replace_or_merge_patch_per_rfc_7396() {
    use sluice_driver_sdk::machine::apply_driver_checkpoint;
    let update = |json: &str, merge: bool| flow::DriverCheckpoint {
        driver_checkpoint_json: json.as_bytes().to_vec(),
        rfc7396_merge_patch: merge,
    };
    let prev = br#"{"a":{"b":1,"c":2},"d":[1],"e":"x"}"#;
    let apply = |u| String::from_utf8(apply_driver_checkpoint(prev, &u).unwrap()).unwrap();
    assert_eq!(
        apply(update(r#"{"a":{"b":null,"z":3},"d":[2],"f":true}"#, true)),
        r#"{"a":{"c":2,"z":3},"d":[2],"e":"x","f":true}"#
    );
    assert_eq!(
        apply(update("{}", true)),
        r#"{"a":{"b":1,"c":2},"d":[1],"e":"x"}"#,
        "no change"
    );
    assert_eq!(
        apply(update(r#"{"q":1}"#, false)),
        r#"{"q":1}"#,
        "replacement"
    );
    assert_eq!(
        apply_driver_checkpoint(b"", &update(r#"{"q":1}"#, true)).unwrap(),
        br#"{"q":1}"#
    );
    let err = apply_driver_checkpoint(prev, &update("{", true)).unwrap_err();
    assert_eq!(
        (err.peer, err.expected.as_str()),
        (Peer::Driver, "a JSON updated driver checkpoint")
    );
}
