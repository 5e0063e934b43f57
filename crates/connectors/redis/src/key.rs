//! The Redis key of a document: `<prefix><hex of the packed key>`.
//!
//! The packed key is the FoundationDB tuple encoding of the collection key's values
//! (`sluice_doc::tuple`), the bytes the runtime sends in Load and Store. Its lowercase
//! hex is printable, unambiguous (two characters a byte, no separator to escape),
//! round-trips exactly ([`decode`]) and sorts like the packed bytes, which sort like the
//! key values. A binding's keys are thus exactly the keys that start with its prefix and
//! continue with an even number of hex digits. Example: key `[42]` packs to `15 2a`, so
//! prefix `views:` stores it under `views:152a`.

/// The Redis key of `packed` under `prefix`.
pub fn encode(prefix: &str, packed: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut key = String::with_capacity(prefix.len() + 2 * packed.len());
    key.push_str(prefix);
    for byte in packed {
        key.push(HEX[(byte >> 4) as usize] as char);
        key.push(HEX[(byte & 0xf) as usize] as char);
    }
    key
}

/// The packed key of a Redis key `key` under `prefix`, or `None` if `key` is not one
/// [`encode`] makes under that prefix.
pub fn decode(prefix: &str, key: &str) -> Option<Vec<u8>> {
    let hex = key.strip_prefix(prefix)?.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    (hex.chunks(2))
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// `prefix` as a SCAN `MATCH` pattern matching exactly the keys that start with it:
/// glob's special characters (`* ? [ ] \`) escaped, then `*`.
pub fn scan_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use sluice_doc::tuple::{pack_key, unpack};

    #[test]
    fn a_key_is_the_prefix_then_the_hex_of_the_packed_tuple() {
        let packed = pack_key(&[json!(42)]);
        assert_eq!(encode("views:", &packed), "views:152a");
        assert_eq!(decode("views:", "views:152a"), Some(packed));
        let packed = pack_key(&[json!("u1")]);
        assert_eq!(
            encode("views:", &packed),
            "views:02753100",
            "as the README says"
        );
        assert_eq!(decode("views:", "views:152"), None, "odd length");
        assert_eq!(decode("views:", "views:15zz"), None, "not hex");
        assert_eq!(decode("views:", "other:152a"), None, "another prefix");
    }

    #[test]
    fn scan_patterns_escape_glob_characters() {
        assert_eq!(scan_pattern("v:"), "v:*");
        assert_eq!(scan_pattern(r"a*b?[c]\"), r"a\*b\?\[c\]\\*");
    }

    proptest! {
        #[test]
        fn keys_round_trip_and_keep_the_order_of_packed_keys(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            b in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            prop_assert_eq!(decode("p:", &encode("p:", &a)), Some(a.clone()));
            prop_assert_eq!(encode("p:", &a).cmp(&encode("p:", &b)), a.cmp(&b));
        }

        #[test]
        fn key_values_round_trip_through_the_redis_key(
            id in any::<i64>(), name in "[a-zA-Z0-9 :*\\[\\]]{0,12}",
        ) {
            let values = vec![json!(id), json!(name)];
            let key = encode("users:", &pack_key(&values));
            let packed = decode("users:", &key).unwrap();
            prop_assert_eq!(unpack(&packed).unwrap(), values);
        }
    }
}
