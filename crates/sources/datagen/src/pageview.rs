//! The generator: document `seq` of a `pageviews` stream as a pure function, written
//! straight as JSON text.
//!
//! Document `seq` (0, 1, 2, ...) is the pure function [`pageview`]`(seed, keys, seq)`:
//! no state but the sequence number, so the source resumes and replays by sequence
//! number (see `source.rs`), and a test computes the expected reduction
//! independently:
//!
//! ```
//! use sluice_datagen::pageview;
//! let (seed, keys, n) = (7, 10, 1000);
//! let mut views = std::collections::BTreeMap::<String, u64>::new();
//! for seq in 0..n {
//!     let doc = pageview(seed, keys, seq);
//!     *views.entry(doc.user_id()).or_default() += doc.views;
//! }
//! assert!(views.len() <= 10);
//! ```
//!
//! The `pageviews` shape (matching design.md's example collection):
//! `{user_id: "user-000042", views: 1..=10, bytes: 0..100000,
//!   last_seen: RFC 3339 (2024-01-01T00:00:00Z + seq seconds), tags: {browser: ...}}`.
//! The key is `mix(seed, seq) % keys`, so every key recurs about `n / keys` times.
//!
//! Each document is written straight as JSON text ([`Pageview::write_json`]), with
//! neither a `Value` nor `core::fmt` in between: plain byte writes, because generating
//! is on the reader's critical path (`core::fmt` took 7% of a datagen pipeline's time).
//! The benches write their rows with the same `write_*` helpers, so that every case
//! generates equally cheaply. The text is fixed, byte for byte (properties in sorted
//! order, no spaces: what `serde_json` wrote for these documents before), because a
//! step's hash covers it: a recovery log written by an older release replays against
//! it.

/// Seconds since the Unix epoch of 2024-01-01T00:00:00Z, the first `last_seen`.
const EPOCH_2024: i64 = 1_704_067_200;
const BROWSERS: [&str; 4] = ["firefox", "chrome", "safari", "edge"];

/// SplitMix64's finaliser: a well-mixed 64-bit function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key (in `0..keys`) of document `seq`.
pub fn key_of(seed: u64, keys: u64, seq: u64) -> u64 {
    mix(seed ^ mix(seq)) % keys
}

/// One document of a `pageviews` generator, as its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pageview {
    /// The number in `user_id` (see [`Pageview::user_id`]).
    pub key: u64,
    pub views: u64,
    pub bytes: u64,
    /// `last_seen` as seconds since the Unix epoch (see [`Pageview::last_seen`]).
    pub last_seen: i64,
    /// `tags.browser`.
    pub browser: &'static str,
}

/// Document `seq` of a `pageviews` generator.
pub fn pageview(seed: u64, keys: u64, seq: u64) -> Pageview {
    let h = mix(seed.wrapping_add(seq).wrapping_mul(31) ^ 0x5eed);
    Pageview {
        key: key_of(seed, keys, seq),
        views: 1 + (h % 10),
        bytes: (h >> 8) % 100_000,
        last_seen: EPOCH_2024 + seq as i64,
        browser: BROWSERS[(h >> 40) as usize % BROWSERS.len()],
    }
}

impl Pageview {
    /// Appends the document as JSON text, exactly as it has always been written (see
    /// the module docs).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"bytes":"#);
        write_decimal(out, self.bytes);
        out.extend_from_slice(br#","last_seen":""#);
        self.write_last_seen(out);
        out.extend_from_slice(br#"","tags":"#);
        self.write_tags(out);
        out.extend_from_slice(br#","user_id":""#);
        self.write_user_id(out);
        out.extend_from_slice(br#"","views":"#);
        write_decimal(out, self.views);
        out.push(b'}');
    }

    /// Appends `user_id`: `user-000042`.
    pub fn write_user_id(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"user-");
        write_zero_padded(out, self.key, 6);
    }

    /// Appends `last_seen`: `2024-01-01T00:00:42Z`.
    pub fn write_last_seen(&self, out: &mut Vec<u8>) {
        Rfc3339(self.last_seen).write(out);
    }

    /// Appends `tags` as JSON text: `{"browser":"firefox"}`.
    pub fn write_tags(&self, out: &mut Vec<u8>) {
        // Browser names need no JSON escaping.
        out.extend_from_slice(br#"{"browser":""#);
        out.extend_from_slice(self.browser.as_bytes());
        out.extend_from_slice(br#""}"#);
    }

    /// `user_id` (see [`Pageview::write_user_id`]).
    pub fn user_id(&self) -> String {
        text(|out| self.write_user_id(out))
    }

    /// `last_seen` (see [`Pageview::write_last_seen`]).
    pub fn last_seen(&self) -> String {
        text(|out| self.write_last_seen(out))
    }

    /// `tags` as JSON text (see [`Pageview::write_tags`]).
    pub fn tags(&self) -> String {
        text(|out| self.write_tags(out))
    }
}

/// Appends `n` in decimal: what `{n}` writes, without `core::fmt`.
pub fn write_decimal(out: &mut Vec<u8>, n: u64) {
    write_zero_padded(out, n, 1);
}

/// Appends `n` in decimal, zero-padded to `width` (at most 20) digits: what `{n:0width$}`
/// writes. A wider `n` is written whole.
fn write_zero_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    // u64::MAX has 20 digits; the zeros are the padding.
    let mut digits = [b'0'; 20];
    let mut first = digits.len();
    let mut rest = n;
    loop {
        first -= 1;
        digits[first] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let first = first.min(digits.len().saturating_sub(width));
    out.extend_from_slice(&digits[first..]);
}

/// The ASCII text that `write` appends.
fn text(write: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut out = Vec::new();
    write(&mut out);
    String::from_utf8(out).expect("the generator writes ASCII")
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch.
struct Rfc3339(i64);

impl Rfc3339 {
    fn write(&self, out: &mut Vec<u8>) {
        let Civil {
            year,
            month,
            day,
            hour,
            minute,
            second,
        } = Civil::of(self.0);
        // As `{year:04}`: the sign counts towards the width (`-042`).
        if year < 0 {
            out.push(b'-');
        }
        write_zero_padded(out, year.unsigned_abs(), 4 - usize::from(year < 0));
        for (separator, part) in [
            (b'-', month),
            (b'-', day),
            (b'T', hour),
            (b':', minute),
            (b':', second),
        ] {
            out.push(separator);
            write_zero_padded(out, part, 2);
        }
        out.push(b'Z');
    }
}

/// A UTC date and time, in the proleptic Gregorian calendar.
struct Civil {
    year: i64,
    month: u64,
    day: u64,
    hour: u64,
    minute: u64,
    second: u64,
}

impl Civil {
    /// The date and time `secs` seconds after the Unix epoch (days→civil date after
    /// Howard Hinnant's `civil_from_days`).
    fn of(secs: i64) -> Civil {
        let (days, rem) = (
            secs.div_euclid(86_400),
            secs.rem_euclid(86_400).unsigned_abs(),
        );
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1).unsigned_abs();
        let month = (if mp < 10 { mp + 3 } else { mp - 9 }).unsigned_abs();
        Civil {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::fmt;

    /// For [`document_as_built_before`], which formats `last_seen` with it.
    impl fmt::Display for Rfc3339 {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&text(|out| self.write(out)))
        }
    }

    /// The documents as they were built before they were written as text: the
    /// reference their bytes (and so the step hashes of existing recovery logs) must
    /// match. Frozen: do not change it along with the generator.
    fn document_as_built_before(seed: u64, keys: u64, seq: u64) -> Value {
        let key = key_of(seed, keys, seq);
        let h = mix(seed.wrapping_add(seq).wrapping_mul(31) ^ 0x5eed);
        json!({
            "user_id": format!("user-{key:06}"),
            "views": 1 + (h % 10),
            "bytes": (h >> 8) % 100_000,
            "last_seen": Rfc3339(EPOCH_2024 + seq as i64).to_string(),
            "tags": {"browser": BROWSERS[(h >> 40) as usize % BROWSERS.len()]},
        })
    }

    #[test]
    fn documents_are_written_byte_for_byte_as_serde_json_wrote_them() {
        let mut text = Vec::new();
        for (seed, keys) in [(7, 100_000), (0, 1), (u64::MAX, 10_000_000)] {
            for seq in (0..20_000).chain([1 << 31, 1 << 40]) {
                text.clear();
                pageview(seed, keys, seq).write_json(&mut text);
                let before = serde_json::to_vec(&document_as_built_before(seed, keys, seq))
                    .expect("a document serializes");
                assert_eq!(
                    String::from_utf8_lossy(&text),
                    String::from_utf8_lossy(&before),
                    "seed {seed}, seq {seq}"
                );
            }
        }
    }

    #[test]
    fn decimals_are_written_as_core_fmt_writes_them_at_every_width() {
        let powers_of_ten = (0..20).map(|exp| 10u64.pow(exp));
        let edges = powers_of_ten
            .flat_map(|p| [p - 1, p, p + 1])
            .chain([u64::MAX]);
        let mut text = Vec::new();
        for n in edges {
            text.clear();
            write_decimal(&mut text, n);
            assert_eq!(String::from_utf8_lossy(&text), n.to_string());
            for width in [1, 2, 4, 6, 20] {
                text.clear();
                write_zero_padded(&mut text, n, width);
                assert_eq!(String::from_utf8_lossy(&text), format!("{n:0width$}"));
            }
        }
    }

    #[test]
    fn user_ids_wider_than_their_padding_are_written_whole() {
        for (key, user_id) in [
            (0, "user-000000"),
            (42, "user-000042"),
            (999_999, "user-999999"),
            (1_000_000, "user-1000000"),
            (u64::MAX, "user-18446744073709551615"),
        ] {
            let doc = Pageview {
                key,
                ..pageview(7, 10, 0)
            };
            assert_eq!(doc.user_id(), user_id);
        }
    }

    #[test]
    fn last_seen_crosses_leap_days_centuries_and_year_widths() {
        for (secs, last_seen) in [
            (EPOCH_2024, "2024-01-01T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (1_709_251_200, "2024-03-01T00:00:00Z"),
            (1_735_689_599, "2024-12-31T23:59:59Z"),
            (1_735_689_600, "2025-01-01T00:00:00Z"),
            (951_827_696, "2000-02-29T12:34:56Z"),
            (4_107_542_399, "2100-02-28T23:59:59Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
            (253_402_300_799, "9999-12-31T23:59:59Z"),
            (253_402_300_800, "10000-01-01T00:00:00Z"),
            (-1, "1969-12-31T23:59:59Z"),
            // What `{year:04}` wrote for year -1: the sign takes a digit's place.
            (-62_167_219_201, "-001-12-31T23:59:59Z"),
        ] {
            let doc = Pageview {
                last_seen: secs,
                ..pageview(7, 10, 0)
            };
            assert_eq!(doc.last_seen(), last_seen, "{secs}");
        }
    }

    #[test]
    fn last_seen_is_written_as_core_fmt_wrote_it_around_every_edge() {
        let as_formatted_before = |secs| {
            let Civil {
                year,
                month,
                day,
                hour,
                minute,
                second,
            } = Civil::of(secs);
            format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
        };
        let (day, year_one, year_ten_thousand) = (86_400, -62_135_596_800, 253_402_300_800);
        let edges = [
            i64::MIN,
            year_one - 366 * day,
            year_one,
            0,
            EPOCH_2024,
            EPOCH_2024 + (1 << 40),
            year_ten_thousand,
            i64::MAX,
        ];
        let mut text = Vec::new();
        for edge in edges {
            let around = edge.saturating_sub(2 * day)..=edge.saturating_add(2 * day);
            for secs in around.step_by(59).chain([edge]) {
                text.clear();
                Rfc3339(secs).write(&mut text);
                assert_eq!(String::from_utf8_lossy(&text), as_formatted_before(secs));
            }
        }
    }
}
