//! Arena builders and readers: round trips, bounded message sizes, malformed input.

use prost::Message;
use sluice_driver_sdk::LoadedSink;
use sluice_driver_sdk::arena::{
    LoadBuilder, LoadedBuilder, MAX_MESSAGE_BYTES, StoreBuilder, StoreDoc, load_keys, loaded_docs,
    slice, store_docs,
};
use sluice_proto::flow::Slice;
use sluice_proto::materialize::transaction_request::Store;

#[test]
fn load_keys_round_trip_per_binding() {
    let mut b = LoadBuilder::new();
    b.push(0, b"a");
    b.push(1, b"x");
    b.push(0, b"");
    b.push(0, b"ccc");
    let loads = b.finish();
    assert_eq!(loads.len(), 2, "one message per binding");
    let keys =
        |i: usize| -> Vec<Vec<u8>> { load_keys(&loads[i]).map(|k| k.unwrap().to_vec()).collect() };
    assert_eq!(
        (loads[0].binding, keys(0)),
        (0, vec![b"a".to_vec(), vec![], b"ccc".to_vec()])
    );
    assert_eq!((loads[1].binding, keys(1)), (1, vec![b"x".to_vec()]));
}

#[test]
fn store_docs_round_trip_with_exists_flags() {
    let mut b = StoreBuilder::new();
    b.push(
        3,
        StoreDoc {
            key: b"k1",
            values: b"v1",
            doc: b"{}",
            exists: true,
        },
    );
    b.push(
        3,
        StoreDoc {
            key: b"k2",
            values: b"",
            doc: b"[1]",
            exists: false,
        },
    );
    let stores = b.finish();
    assert_eq!(stores.len(), 1);
    let docs: Vec<StoreDoc<'_>> = store_docs(&stores[0]).map(Result::unwrap).collect();
    assert_eq!(
        docs,
        vec![
            StoreDoc {
                key: b"k1",
                values: b"v1",
                doc: b"{}",
                exists: true
            },
            StoreDoc {
                key: b"k2",
                values: b"",
                doc: b"[1]",
                exists: false
            },
        ]
    );
}

#[test]
fn loaded_messages_are_cut_at_the_bound_and_keep_every_document_in_order() {
    let doc = vec![b'7'; 100_000];
    let count = 3 * MAX_MESSAGE_BYTES / doc.len();
    let mut b = LoadedBuilder::new();
    let mut ready = Vec::new();
    for _ in 0..count {
        b.push(0, &doc);
        ready.extend(b.take_ready());
    }
    assert!(ready.len() >= 2, "full messages are ready before finish");
    ready.extend(b.finish());
    assert!(ready.len() >= 3);
    for loaded in &ready {
        assert!(
            loaded.encoded_len() <= MAX_MESSAGE_BYTES,
            "{} bytes",
            loaded.encoded_len()
        );
    }
    let total: usize = ready
        .iter()
        .map(|l| {
            loaded_docs(l)
                .filter(|d| d.as_ref().unwrap() == &doc)
                .count()
        })
        .sum();
    assert_eq!(total, count);
}

#[test]
fn an_item_larger_than_the_bound_gets_a_message_of_its_own() {
    let big = vec![b'x'; MAX_MESSAGE_BYTES + 1];
    let mut b = LoadBuilder::new();
    b.push(0, b"small-before");
    b.push(0, &big);
    b.push(0, b"small-after");
    let loads = b.finish();
    let sizes: Vec<usize> = loads.iter().map(|l| l.packed_keys.len()).collect();
    assert_eq!(sizes, vec![1, 1, 1]);
    assert_eq!(load_keys(&loads[1]).next().unwrap().unwrap(), &big[..]);
}

#[test]
fn slice_outside_its_arena_is_an_error_naming_it() {
    let err = slice(b"abc", &Slice { begin: 2, end: 9 }).unwrap_err();
    assert!(
        err.to_string()
            .contains("slice [2, 9) is outside an arena of 3 bytes"),
        "{err}"
    );
    let err = slice(b"abc", &Slice { begin: 2, end: 1 }).unwrap_err();
    assert!(err.to_string().contains("[2, 1)"), "{err}");
}

#[test]
fn store_with_mismatched_lengths_is_malformed() {
    let store = Store {
        binding: 4,
        arena: b"kd".to_vec(),
        packed_keys: vec![Slice { begin: 0, end: 1 }],
        packed_values: vec![],
        docs_json: vec![Slice { begin: 1, end: 2 }],
        exists: vec![false],
    };
    let items: Vec<_> = store_docs(&store).collect();
    assert_eq!(items.len(), 1);
    let err = items.into_iter().next().unwrap().unwrap_err();
    assert!(
        err.to_string()
            .contains("Store of binding 4 has 1 keys, 0 values"),
        "{err}"
    );
}
