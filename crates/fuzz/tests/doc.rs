//! Fuzz targets of the decoders of outside input sluice-doc owns (issue 34): JSON text
//! into a [`Doc`], and packed tuples back into values. Whatever the bytes, each returns
//! `Ok` or `Err`: never a panic, a hang or an allocation the input's length does not
//! bound.
//!
//! Each target is a bounded `#[test]` (2 s of generated inputs, after the corpus in
//! `tests/__fuzz__/<target>/corpus`), and runs coverage-guided on stable Rust with
//! `cargo bolero test -p sluice-fuzz <target>`: see docs/fuzzing.md.

use sluice_doc::compact::Doc;
use sluice_doc::parse::DocParser;
use sluice_doc::tuple::{elements, pack_key, unpack};
use std::cell::RefCell;
use std::time::Duration;

thread_local! {
    static PARSER: RefCell<DocParser> = RefCell::new(DocParser::default());
}

/// How long each target generates inputs in a normal test run.
const TEST_TIME: Duration = Duration::from_secs(2);

/// Longest generated input: longer texts find little more and cost more per run.
const MAX_LEN: usize = 4096;

/// `DocParser::parse` on any bytes: `Ok` or `Err`, and exactly serde_json's verdict (the
/// same document, or an error with the same message). One parser serves every input, so
/// stale scratch state would show.
#[test]
fn fuzz_doc_parser_agrees_with_serde_json() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let ours = PARSER.with(|parser| parser.borrow_mut().parse(bytes));
            let theirs = serde_json::from_slice::<Doc>(bytes);
            match (&ours, &theirs) {
                (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs),
                (Err(ours), Err(theirs)) => assert_eq!(ours.to_string(), theirs.to_string()),
                _ => panic!("ours {ours:?}, serde_json's {theirs:?}"),
            }
        });
}

/// `unpack` on any bytes: `Ok` or `Err`; what it decodes packs and unpacks to itself,
/// and `elements` reads it too (`elements` checks less: it leaves JSON bytes elements
/// and NaN unjudged, so it may take what `unpack` refuses).
#[test]
fn fuzz_tuple_unpack_returns_values_or_an_error() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let unpacked = unpack(bytes);
            let elements_ok = elements(bytes).all(|e| e.is_ok());
            assert!(
                elements_ok || unpacked.is_err(),
                "unpack took what elements refused"
            );
            if let Ok(values) = unpacked {
                let repacked = pack_key(&values);
                assert_eq!(unpack(&repacked).expect("a packed key unpacks"), values);
            }
        });
}
