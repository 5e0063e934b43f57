//! The generated types put the protocol's field numbers and wire types on the wire.
//!
//! Each expected byte string is derived by hand from `shared/protocol.md`, so a wrong
//! field number, scalar type (`fixed32` vs `uint32`) or packing in the `.proto` files
//! fails here even though our own encoder and decoder would agree with each other.
//!
//! Reminder: a field's tag is the varint `(field_number << 3) | wire_type`, with wire
//! types 0 = varint, 2 = length-delimited, 5 = 32-bit little-endian. proto3 leaves out
//! scalars equal to their default (0, false, empty), encodes fields in field-number
//! order, packs repeated scalars, and writes a set message field even when it is empty.

use prost::Message;
use sluice_proto::flow::{DriverCheckpoint, Slice};
use sluice_proto::materialize::{TransactionRequest, TransactionResponse, transaction_request};

/// Encodes `msg`, checks the bytes, and checks they decode back to `msg`.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, want: &[u8]) {
    let bytes = msg.encode_to_vec();
    assert_eq!(bytes, want, "encoding of {msg:?}");
    assert_eq!(&M::decode(want).expect("decode"), msg);
}

#[test]
fn open_carries_fixed32_key_range_and_checkpoint_bytes() {
    // Open { key_begin = 3 fixed32, key_end = 4 fixed32, driver_checkpoint_json = 5 bytes }:
    //   key_begin 0x01020304: tag (3<<3)|5 = 0x1d, then little-endian 04 03 02 01
    //   key_end 0xffffffff:   tag (4<<3)|5 = 0x25, then ff ff ff ff
    //   checkpoint b"{}":     tag (5<<3)|2 = 0x2a, length 02, then 7b 7d
    //   => 5 + 5 + 4 = 14 bytes.
    // TransactionRequest.open = 1: tag (1<<3)|2 = 0x0a, length 0x0e, then the 14 bytes.
    let msg = TransactionRequest {
        open: Some(transaction_request::Open {
            key_begin: 0x0102_0304,
            key_end: u32::MAX,
            driver_checkpoint_json: b"{}".to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x0a, 0x0e,
        0x1d, 0x04, 0x03, 0x02, 0x01,
        0x25, 0xff, 0xff, 0xff, 0xff,
        0x2a, 0x02, b'{', b'}',
    ];
    assert_wire(&msg, &want);
}

#[test]
fn store_carries_arena_slices_and_packed_exists() {
    // Store { binding = 1 uint32, arena = 2 bytes, packed_keys = 3 repeated Slice,
    //         exists = 6 repeated bool (packed) }:
    //   binding 1:            tag (1<<3)|0 = 0x08, varint 01
    //   arena 15 01 15 02:    tag (2<<3)|2 = 0x12, length 04, then the 4 bytes
    //                         (the packed keys (1) and (2))
    //   packed_keys[0] {0,2}: tag (3<<3)|2 = 0x1a, length 02, then Slice:
    //                         begin 0 is the default and left out; end: tag 0x10, 02
    //   packed_keys[1] {2,4}: tag 0x1a, length 04, then begin: tag 0x08, 02; end: 0x10, 04
    //   exists [true,false]:  tag (6<<3)|2 = 0x32, length 02, then 01 00
    //   => 2 + 6 + 4 + 6 + 4 = 22 bytes.
    // TransactionRequest.store = 4: tag (4<<3)|2 = 0x22, length 0x16, then the 22 bytes.
    let msg = TransactionRequest {
        store: Some(transaction_request::Store {
            binding: 1,
            arena: vec![0x15, 0x01, 0x15, 0x02],
            packed_keys: vec![Slice { begin: 0, end: 2 }, Slice { begin: 2, end: 4 }],
            exists: vec![true, false],
            ..Default::default()
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x22, 0x16,
        0x08, 0x01,
        0x12, 0x04, 0x15, 0x01, 0x15, 0x02,
        0x1a, 0x02, 0x10, 0x02,
        0x1a, 0x04, 0x08, 0x02, 0x10, 0x04,
        0x32, 0x02, 0x01, 0x00,
    ];
    assert_wire(&msg, &want);
}

#[test]
fn prepared_carries_a_merge_patch_driver_checkpoint() {
    // DriverCheckpoint { driver_checkpoint_json = 1 bytes, rfc7396_merge_patch = 2 bool }:
    //   json {"a":1}:  tag (1<<3)|2 = 0x0a, length 07, then 7b 22 61 22 3a 31 7d
    //   merge patch:   tag (2<<3)|0 = 0x10, varint 01
    //   => 9 + 2 = 11 bytes.
    // TransactionResponse.prepared = 3: tag (3<<3)|2 = 0x1a, length 0x0b, then the 11 bytes.
    let msg = TransactionResponse {
        prepared: Some(DriverCheckpoint {
            driver_checkpoint_json: br#"{"a":1}"#.to_vec(),
            rfc7396_merge_patch: true,
        }),
        ..Default::default()
    };
    #[rustfmt::skip]
    let want = [
        0x1a, 0x0b,
        0x0a, 0x07, b'{', b'"', b'a', b'"', b':', b'1', b'}',
        0x10, 0x01,
    ];
    assert_wire(&msg, &want);
}

#[test]
fn empty_commit_is_still_present_on_the_wire() {
    // TransactionRequest.commit = 5 holds an empty message; being set is the whole
    // content: tag (5<<3)|2 = 0x2a, length 00.
    let msg = TransactionRequest {
        commit: Some(transaction_request::Commit::default()),
        ..Default::default()
    };
    assert_wire(&msg, &[0x2a, 0x00]);
    assert!(
        TransactionRequest::decode(&[][..])
            .unwrap()
            .commit
            .is_none()
    );
}
