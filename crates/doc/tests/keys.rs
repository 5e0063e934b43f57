//! Packed keys as other systems see them: byte-exact tuple vectors (the FoundationDB
//! tuple spec and `shared/protocol.md`), the golden key hashes, key extraction from
//! documents, and the order-preservation properties ranges and sorted drains rely on.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_doc::compact::Doc;
use sluice_doc::key_hash;
use sluice_doc::ptr::Pointer;
use sluice_doc::tuple::{
    KeyError, KeyExtractor, TupleError, pack_doc, pack_key, pack_value, unpack, unpack_json_array,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn packed(value: Value) -> String {
    hex(&pack_key(&[value]))
}

#[test]
fn integers_match_the_tuple_spec_bytes() {
    let cases: [(Value, &str); 14] = [
        (json!(-5551212), "11ab4b93"),
        (json!(256), "160100"),
        (json!(-256), "12feff"),
        (json!(0), "14"),
        (json!(1), "1501"),
        (json!(-1), "13fe"),
        (json!(255), "15ff"),
        (json!(-255), "1300"),
        (json!(10), "150a"),
        (json!(u64::MAX), "1cffffffffffffffff"),
        (json!(i64::MAX), "1c7fffffffffffffff"),
        (json!(i64::MIN), "0c7fffffffffffffff"),
        (json!(i64::MIN + 1), "0c8000000000000000"),
        (json!(1u64 << 32), "190100000000"),
    ];
    for (value, want) in cases {
        assert_eq!(packed(value.clone()), want, "{value}");
    }
}

#[test]
fn strings_escape_nul_and_keep_utf8() {
    assert_eq!(
        packed(json!("F\u{00d4}O\u{0000}bar")),
        "0246c3944f00ff62617200"
    );
    assert_eq!(packed(json!("")), "0200");
    assert_eq!(packed(json!("\u{0}\u{0}")), "0200ff00ff00");
    assert_eq!(packed(json!("日")), "02e697a500");
}

#[test]
fn floats_are_doubles_and_differ_from_equal_integers() {
    assert_eq!(packed(json!(3)), "1503");
    assert_eq!(packed(json!(3.0)), "21c008000000000000");
    // -42.0 is 0xc045000000000000; negative, so every bit flips.
    assert_eq!(packed(json!(-42.0)), "213fbaffffffffffff");
    assert_eq!(packed(json!(0.0)), "218000000000000000");
    assert_eq!(packed(json!(-0.0)), "217fffffffffffffff");
    // JSON text `3.0` parses to a float, so it keeps its own key.
    let three: Value = serde_json::from_str("3.0").unwrap();
    assert_ne!(pack_key(&[three]), pack_key(&[json!(3)]));
}

#[test]
fn null_and_booleans_are_single_bytes() {
    assert_eq!(packed(json!(null)), "00");
    assert_eq!(packed(json!(false)), "26");
    assert_eq!(packed(json!(true)), "27");
}

#[test]
fn arrays_and_objects_pack_as_bytes_of_sorted_compact_json() {
    let mut want = vec![0x01];
    want.extend_from_slice(br#"[1,"a",{"x":null,"y":2.5}]"#);
    want.push(0x00);
    let doc: Value = serde_json::from_str(r#"[1, "a", {"y": 2.5, "x": null}]"#).unwrap();
    assert_eq!(pack_key(&[doc]), want);
    assert_eq!(hex(&pack_key(&[json!({})])), "017b7d00");
}

#[test]
fn composite_keys_are_plain_concatenation() {
    assert_eq!(
        hex(&pack_key(&[json!("foo"), json!("bar")])),
        "02666f6f000262617200"
    );
    let mut out = vec![0xaa];
    pack_value(&json!(1), &mut out);
    pack_value(&json!(null), &mut out);
    assert_eq!(hex(&out), "aa150100");
}

#[test]
fn golden_key_hashes_match_protocol_md() {
    let cases: [(&[Value], &str, u32); 8] = [
        (&[json!(true)], "27", 0xb9f08d38),
        (&[json!(false)], "26", 0x1505e3cb),
        (
            &[json!("foo"), json!("bar")],
            "02666f6f000262617200",
            0x6ae719f3,
        ),
        (&[json!("foobar")], "02666f6f62617200", 0x8adddd61),
        (&[json!("1")], "023100", 0xf4ec4d33),
        (&[json!("10")], "02313000", 0x17751bae),
        (&[json!(1)], "1501", 0x3c90c1d9),
        (&[json!(10)], "150a", 0xd1d3f3eb),
    ];
    for (key, want_packed, want_hash) in cases {
        let bytes = pack_key(key);
        assert_eq!(hex(&bytes), want_packed, "{key:?}");
        assert_eq!(
            key_hash(&bytes),
            want_hash,
            "{key:?}: {:08x}",
            key_hash(&bytes)
        );
    }
}

#[test]
fn unpack_returns_the_packed_values() {
    let values = vec![
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(-0.5),
        json!("a\u{0}b"),
        json!({"k": [1, 2.0, "x"]}),
    ];
    let bytes = pack_key(&values);
    assert_eq!(unpack(&bytes).unwrap(), values);
    assert_eq!(unpack_json_array(&bytes).unwrap(), Value::Array(values));
}

fn malformed_offset(bytes: &[u8]) -> (usize, String) {
    match unpack(bytes) {
        Err(TupleError::Malformed { offset, reason }) => (offset, reason),
        Ok(values) => panic!("{} unpacked as {values:?}", hex(bytes)),
    }
}

#[test]
fn unknown_type_codes_are_errors_naming_the_offset() {
    let (offset, reason) = malformed_offset(b"\x15\x01\x30");
    assert_eq!(offset, 2);
    assert!(reason.contains("0x30"), "{reason}");
    // Arbitrary-precision integers cannot be JSON numbers.
    assert_eq!(malformed_offset(b"\x1d\x09").0, 0);
}

#[test]
fn truncated_elements_are_errors_naming_the_offset() {
    assert_eq!(malformed_offset(b"\x27\x16\x01").0, 2);
    assert_eq!(malformed_offset(b"\x02abc").0, 0);
    assert_eq!(malformed_offset(b"\x00\x21\x80").0, 2);
}

#[test]
fn integers_beyond_i64_min_are_refused() {
    // -(2^64 - 1): magnitude all ones, one's complement all zeros.
    let (offset, reason) = malformed_offset(b"\x0c\x00\x00\x00\x00\x00\x00\x00\x00");
    assert_eq!(offset, 0);
    assert!(reason.contains("JSON integer range"), "{reason}");
}

#[test]
fn bytes_that_are_not_json_text_are_refused() {
    let (offset, reason) = malformed_offset(b"\x14\x01nope\x00");
    assert_eq!(offset, 1);
    assert!(reason.contains("not JSON"), "{reason}");
}

fn extractor(pointers: &[&str], defaults: &[Option<Value>]) -> KeyExtractor {
    let pointers = pointers
        .iter()
        .map(|p| Pointer::parse(p).unwrap())
        .collect();
    KeyExtractor::new(pointers, defaults.to_vec())
}

#[test]
fn extracted_keys_follow_pointer_order_and_escapes() {
    let doc = json!({"a/b": "x", "m~n": [7, 8], "id": 3});
    let x = extractor(&["/id", "/a~1b", "/m~0n/1"], &[None, None, None]);
    let mut out = Vec::new();
    x.pack(&doc, &mut out).unwrap();
    assert_eq!(out, pack_key(&[json!(3), json!("x"), json!(8)]));
}

#[test]
fn a_missing_key_location_without_default_is_an_error_naming_the_pointer() {
    let x = extractor(&["/id", "/a~1b"], &[None, None]);
    let mut out = Vec::new();
    match x.pack(&json!({"id": 1}), &mut out) {
        Err(err @ KeyError::Missing { .. }) => {
            assert_eq!(
                err.to_string(),
                "document is missing key location /a~1b, which has no default in the schema"
            );
        }
        Ok(()) => panic!("packed {}", hex(&out)),
    }
    assert!(out.is_empty());
    let err = x.pack_doc(&Doc::from(&json!({"a/b": 1})), &mut out);
    assert!(matches!(err, Err(KeyError::Missing { pointer }) if pointer == "/id"));
}

/// A missing key location packs as its default, exactly as if the document held it,
/// from either document form; a present value, `null` included, is never replaced.
#[test]
fn a_missing_key_location_takes_its_default() {
    let defaults = [None, Some(json!("eu")), Some(json!({"b": 1, "a": [0]}))];
    let x = extractor(&["/id", "/region", "/tags"], &defaults);
    let full = json!({"id": 7, "region": "eu", "tags": {"a": [0], "b": 1}});
    let mut want = Vec::new();
    x.pack(&full, &mut want).unwrap();
    for doc in [json!({"id": 7}), json!({"id": 7, "region": "eu"}), full] {
        let (mut by_value, mut by_doc) = (Vec::new(), Vec::new());
        x.pack(&doc, &mut by_value).unwrap();
        x.pack_doc(&Doc::from(&doc), &mut by_doc).unwrap();
        assert_eq!(hex(&by_value), hex(&want), "{doc}");
        assert_eq!(hex(&by_doc), hex(&want), "{doc}");
    }
    let mut explicit_null = Vec::new();
    x.pack(&json!({"id": 7, "region": null}), &mut explicit_null)
        .unwrap();
    assert_ne!(explicit_null, want);
    assert_eq!(&explicit_null[2..3], [0x00], "null packs as null");
}

/// A JSON integer from either end of the range, as its exact value.
fn any_json_integer() -> impl Strategy<Value = i128> {
    prop_oneof![
        any::<i64>().prop_map(i128::from),
        any::<u64>().prop_map(i128::from),
        (-300i64..300).prop_map(i128::from),
    ]
}

fn integer_value(i: i128) -> Value {
    match u64::try_from(i) {
        Ok(u) => json!(u),
        Err(_) => json!(i64::try_from(i).unwrap()),
    }
}

fn finite_f64() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite())
}

fn pack_one(v: Value) -> Vec<u8> {
    pack_key(&[v])
}

/// Any JSON value, nested a little.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any_json_integer().prop_map(integer_value),
        finite_f64().prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn packed_integer_order_is_numeric_order(a in any_json_integer(), b in any_json_integer()) {
        let (pa, pb) = (pack_one(integer_value(a)), pack_one(integer_value(b)));
        prop_assert_eq!(pa.cmp(&pb), a.cmp(&b), "{} vs {}", hex(&pa), hex(&pb));
    }

    #[test]
    fn packed_double_order_is_total_float_order(a in finite_f64(), b in finite_f64()) {
        let (pa, pb) = (pack_one(json!(a)), pack_one(json!(b)));
        prop_assert_eq!(pa.cmp(&pb), a.total_cmp(&b));
    }

    #[test]
    fn packed_string_order_is_string_order(a in any::<String>(), b in any::<String>()) {
        let (pa, pb) = (pack_one(json!(a)), pack_one(json!(b)));
        prop_assert_eq!(pa.cmp(&pb), a.cmp(&b));
    }

    #[test]
    fn composite_key_order_is_lexicographic_tuple_order(
        a in (any_json_integer(), any::<String>()),
        b in (any_json_integer(), any::<String>()),
    ) {
        let pack = |(i, s): &(i128, String)| pack_key(&[integer_value(*i), json!(s)]);
        prop_assert_eq!(pack(&a).cmp(&pack(&b)), a.cmp(&b));
        // And with the component types swapped around.
        let pack = |(i, s): &(i128, String)| pack_key(&[json!(s), integer_value(*i)]);
        prop_assert_eq!(pack(&a).cmp(&pack(&b)), (&a.1, a.0).cmp(&(&b.1, b.0)));
    }

    #[test]
    fn unpack_inverts_pack(values in prop::collection::vec(any_json(), 0..4)) {
        let bytes = pack_key(&values);
        prop_assert_eq!(unpack(&bytes).unwrap(), values);
    }
}

proptest! {
    /// What stores do with a drained compact document (serialize it, pack its values,
    /// query its fields) gives exactly what the same `Value` gives, and JSON text parses
    /// into the compact form of what it parses into as a `Value`.
    #[test]
    fn compact_documents_serialize_parse_pack_and_query_like_values(value in any_json()) {
        let doc = Doc::from(&value);
        let text = value.to_string();
        prop_assert_eq!(serde_json::to_string(&doc).unwrap(), text.clone());
        prop_assert_eq!(serde_json::from_str::<Doc>(&text).unwrap(), doc.clone());
        let (mut packed_doc, mut packed_value) = (Vec::new(), Vec::new());
        pack_doc(&doc, &mut packed_doc);
        pack_value(&value, &mut packed_value);
        prop_assert_eq!(packed_doc, packed_value);
        let mut pointers = vec![Pointer::root()];
        if let Value::Object(map) = &value {
            for name in map.keys() {
                let escaped = name.replace('~', "~0").replace('/', "~1");
                pointers.push(Pointer::parse(&format!("/{escaped}")).unwrap());
                pointers.push(Pointer::parse(&format!("/{escaped}/0")).unwrap());
            }
        }
        pointers.push(Pointer::parse("/0").unwrap());
        pointers.push(Pointer::parse("/absent").unwrap());
        for pointer in &pointers {
            let expected = pointer.query(&value).map(Doc::from);
            prop_assert_eq!(pointer.query_doc(&doc), expected.as_ref());
        }
    }
}

#[test]
fn a_repeated_property_keeps_its_last_value_in_the_compact_form_as_in_a_value() {
    let text = r#"{"b":1,"a":2,"b":{"c":3}}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    let doc: Doc = serde_json::from_str(text).unwrap();
    assert_eq!(doc, Doc::from(value));
    assert_eq!(
        serde_json::to_string(&doc).unwrap(),
        r#"{"a":2,"b":{"c":3}}"#
    );
}
