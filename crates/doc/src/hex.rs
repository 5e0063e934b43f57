//! Lowercase hex text of bytes: how packed keys, checkpoints' key bounds and recorded
//! specs are written where only text goes (JSON files, SQL literals, error messages).

/// Two lowercase hex digits per byte.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}

/// The bytes of [`encode`]'s text (either case); `None` if it is not hex.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    // `from_str_radix` alone would take a sign ("+1").
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bad_text_is_refused() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(encode(&bytes), "000fa5ff");
        assert_eq!(decode("000fa5ff").as_deref(), Some(&bytes[..]));
        assert_eq!(decode("000FA5FF").as_deref(), Some(&bytes[..]));
        assert_eq!(decode(""), Some(Vec::new()));
        for bad in ["0", "0g", "+1", "é0"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
