//! The generated types of Flow's current protocol put its field numbers and wire types
//! on the wire (see wire.rs for the seed's). Each expected byte string is derived by
//! hand from estuary/flow's `materialize.proto`, `flow.proto` and Gazette's
//! `consumer.proto`, so a wrong number or scalar type fails here even though our own
//! encoder and decoder would agree with each other.
//!
//! Reminder: a tag is the varint `(field_number << 3) | wire_type`, wire types 0 =
//! varint, 2 = length-delimited, 5 = 32-bit little-endian; defaults are left out.

use prost::Message;
use sluice_proto::current::{consumer, flow, materialize as cm};
use sluice_proto::materialize::{TransactionRequest, transaction_request};

fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, want: &[u8]) {
    assert_eq!(msg.encode_to_vec(), want, "encoding of {msg:?}");
    assert_eq!(&M::decode(want).expect("decode"), msg);
}

#[test]
fn the_rebuild_sentinel_is_a_checkpoint_of_rebuild_from_zero() {
    // rebuild_from_zero = 536870911 (2^29 - 1), varint: tag (2^29-1)<<3 | 0 = 0xfffffff8,
    // as a varint f8 ff ff ff 0f; then true, 01.
    let sentinel = [0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01];
    let msg = consumer::Checkpoint {
        rebuild_from_zero: true,
        ..Default::default()
    };
    assert_wire(&msg, &sentinel);
}

#[test]
fn load_carries_binding_key_json_and_packed_key() {
    // Load { binding = 1 uint32, key_json = 2 bytes, key_packed = 3 bytes }:
    //   binding 2:           08 02
    //   key_json "[1]":      tag (2<<3)|2 = 0x12, length 03, 5b 31 5d
    //   key_packed 15 01:    tag (3<<3)|2 = 0x1a, length 02, 15 01
    //   => 2 + 5 + 4 = 11 bytes.
    // Request.load = 5: tag (5<<3)|2 = 0x2a, length 0x0b.
    let msg = cm::Request {
        load: Some(cm::request::Load {
            binding: 2,
            key_json: b"[1]".to_vec(),
            key_packed: vec![0x15, 0x01],
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x2a, 0x0b,
        0x08, 0x02,
        0x12, 0x03, b'[', b'1', b']',
        0x1a, 0x02, 0x15, 0x01,
    ];
    assert_wire(&msg, &want);
}

#[test]
fn open_carries_a_fixed32_range() {
    // RangeSpec { key_begin = 2, key_end = 3, r_clock_begin = 4, r_clock_end = 5 },
    // all fixed32:
    //   key_begin 1:            tag (2<<3)|5 = 0x15, 01 00 00 00
    //   key_end ffffffff:       tag (3<<3)|5 = 0x1d, ff ff ff ff
    //   r_clock_begin 0:        left out
    //   r_clock_end ffffffff:   tag (5<<3)|5 = 0x2d, ff ff ff ff
    //   => 15 bytes. Open.range = 3: tag 0x1a, length 0x0f => 17 bytes.
    // Request.open = 4: tag (4<<3)|2 = 0x22, length 0x11.
    let msg = cm::Request {
        open: Some(cm::request::Open {
            range: Some(flow::RangeSpec {
                key_begin: 1,
                key_end: u32::MAX,
                r_clock_begin: 0,
                r_clock_end: u32::MAX,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x22, 0x11,
        0x1a, 0x0f,
        0x15, 0x01, 0x00, 0x00, 0x00,
        0x1d, 0xff, 0xff, 0xff, 0xff,
        0x2d, 0xff, 0xff, 0xff, 0xff,
    ];
    assert_wire(&msg, &want);
}

#[test]
fn start_commit_carries_a_checkpoint_of_ack_intents() {
    // Checkpoint.ack_intents = 2, map<string, bytes>: one entry message per pair,
    //   key = 1 "sluice":  0a 06 73 6c 75 69 63 65
    //   value = 2 ab:      12 01 ab
    //   => entry of 11 bytes: tag (2<<3)|2 = 0x12, length 0x0b => 13 bytes.
    // StartCommit.runtime_checkpoint = 1: tag 0x0a, length 0x0d => 15 bytes.
    // Request.start_commit = 8: tag (8<<3)|2 = 0x42, length 0x0f.
    let msg = cm::Request {
        start_commit: Some(cm::request::StartCommit {
            runtime_checkpoint: Some(consumer::Checkpoint {
                ack_intents: [("sluice".to_string(), vec![0xab])].into(),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x42, 0x0f,
        0x0a, 0x0d,
        0x12, 0x0b,
        0x0a, 0x06, b's', b'l', b'u', b'i', b'c', b'e',
        0x12, 0x01, 0xab,
    ];
    assert_wire(&msg, &want);
}

#[test]
fn started_commit_carries_a_connector_state() {
    // ConnectorState { updated_json = 1 bytes, merge_patch = 2 bool }:
    //   0a 02 7b 7d, 10 01 => 6 bytes. StartedCommit.state = 1: 0a 06 => 8 bytes.
    // Response.started_commit = 7: tag (7<<3)|2 = 0x3a, length 08.
    let msg = cm::Response {
        started_commit: Some(cm::response::StartedCommit {
            state: Some(flow::ConnectorState {
                updated_json: b"{}".to_vec(),
                merge_patch: true,
            }),
        }),
        ..Default::default()
    };
    let want = [0x3a, 0x08, 0x0a, 0x06, 0x0a, 0x02, b'{', b'}', 0x10, 0x01];
    assert_wire(&msg, &want);
}

#[test]
fn an_empty_acknowledged_and_internal_bytes() {
    // Response.acknowledged = 8: tag (8<<3)|2 = 0x42, length 00 (set, though empty).
    // Response.internal = 100: tag (100<<3)|2 = 802, as a varint a2 06; length 01, 07.
    let msg = cm::Response {
        acknowledged: Some(cm::response::Acknowledged { state: None }),
        internal: vec![0x07],
        ..Default::default()
    };
    assert_wire(&msg, &[0x42, 0x00, 0xa2, 0x06, 0x01, 0x07]);
}

#[test]
fn the_seed_commit_extension_carries_a_checkpoint_at_field_100() {
    // TransactionRequest.commit = 5: tag 0x2a; Commit.flow_checkpoint = 100 bytes:
    //   tag (100<<3)|2 = 802, varint a2 06; length 02, "cp" => 5 bytes.
    let msg = TransactionRequest {
        commit: Some(transaction_request::Commit {
            flow_checkpoint: b"cp".to_vec(),
        }),
        ..Default::default()
    };
    assert_wire(&msg, &[0x2a, 0x05, 0xa2, 0x06, 0x02, b'c', b'p']);
}
