//! Just enough DER to name a certificate's issuer in an error: the walk from the
//! certificate to its issuer `Name`, and the common attributes of that name. Any input
//! is safe: what does not parse gives `None`.
//!
//! ```text
//!  Certificate SEQUENCE { TBSCertificate SEQUENCE { [0] version?, serial INTEGER,
//!      signature SEQUENCE, issuer Name = SEQUENCE OF SET OF SEQUENCE { OID, value } … } … }
//! ```

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xA0;

/// The issuer of the DER certificate `certificate`, as `CN=…, O=…` (its attributes in
/// order, the common ones by name); `None` when it cannot be read.
pub fn issuer(certificate: &[u8]) -> Option<String> {
    let (certificate, _) = expect(SEQUENCE, certificate)?;
    let (tbs, _) = expect(SEQUENCE, certificate)?;
    let (tag, _, mut rest) = element(tbs)?;
    if tag == VERSION {
        rest = element(rest)?.2; // the serial number
    }
    let (_, rest) = expect(SEQUENCE, rest)?; // the signature algorithm
    let (mut name, _) = expect(SEQUENCE, rest)?;
    let mut parts = Vec::new();
    while !name.is_empty() {
        let (set, next) = expect(SET, name)?;
        name = next;
        let (attribute, _) = expect(SEQUENCE, set)?;
        let (oid, value) = expect(OID, attribute)?;
        let (_, value, _) = element(value)?;
        let label = match oid {
            [0x55, 0x04, 0x03] => "CN",
            [0x55, 0x04, 0x06] => "C",
            [0x55, 0x04, 0x07] => "L",
            [0x55, 0x04, 0x08] => "ST",
            [0x55, 0x04, 0x0A] => "O",
            [0x55, 0x04, 0x0B] => "OU",
            _ => continue,
        };
        parts.push(format!("{label}={}", String::from_utf8_lossy(value)));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The content of the element at the start of `input` if its tag is `tag`, and what
/// follows it.
fn expect(tag: u8, input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (found, content, rest) = element(input)?;
    (found == tag).then_some((content, rest))
}

/// The tag, content and rest of the element at the start of `input` (single-byte tags,
/// definite lengths of up to four bytes, as DER has).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, input) = input.split_first()?;
    let (&first, mut input) = input.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7F);
        if count == 0 || count > 4 || input.len() < count {
            return None;
        }
        let (bytes, rest) = input.split_at(count);
        input = rest;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    (input.len() >= length).then(|| {
        let (content, rest) = input.split_at(length);
        (tag, content, rest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLV with a short length.
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if content.len() < 0x80 {
            out.push(content.len() as u8);
        } else {
            out.extend([0x82, (content.len() >> 8) as u8, content.len() as u8]);
        }
        out.extend_from_slice(content);
        out
    }

    fn attribute(oid: &[u8], value: &str) -> Vec<u8> {
        let pair = [tlv(OID, oid), tlv(0x0C, value.as_bytes())].concat();
        tlv(SET, &tlv(SEQUENCE, &pair))
    }

    fn certificate(version: bool, issuer: &[u8]) -> Vec<u8> {
        let mut tbs = Vec::new();
        if version {
            tbs.extend(tlv(VERSION, &tlv(0x02, &[2])));
        }
        tbs.extend(tlv(0x02, &[0x01, 0x23]));
        tbs.extend(tlv(SEQUENCE, &tlv(OID, &[0x2A, 0x86, 0x48])));
        tbs.extend(tlv(SEQUENCE, issuer));
        tbs.extend(tlv(SEQUENCE, &[0u8; 200])); // validity, long enough for a long length
        tlv(
            SEQUENCE,
            &[tlv(SEQUENCE, &tbs), tlv(SEQUENCE, &[])].concat(),
        )
    }

    #[test]
    fn names_the_issuer_with_or_without_a_version() {
        let name = [
            attribute(&[0x55, 0x04, 0x06], "DE"),
            attribute(&[0x2A, 0x03], "skipped"),
            attribute(&[0x55, 0x04, 0x03], "Sluice test ca"),
        ]
        .concat();
        for version in [true, false] {
            assert_eq!(
                issuer(&certificate(version, &name)).as_deref(),
                Some("C=DE, CN=Sluice test ca")
            );
        }
    }

    #[test]
    fn anything_else_is_none_and_never_a_panic() {
        let name = attribute(&[0x55, 0x04, 0x03], "ca");
        let whole = certificate(true, &name);
        for end in 0..whole.len() {
            let _ = issuer(&whole[..end]);
        }
        assert_eq!(issuer(&certificate(true, &[])), None);
        assert_eq!(issuer(b""), None);
        assert_eq!(issuer(&[0x30, 0x84, 0xFF, 0xFF, 0xFF, 0xFF]), None);
        assert_eq!(issuer(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
    }
}
