//! Fuzz target of the recovery log's reader (issue 34), through its `#[doc(hidden)]`
//! entry point: the file is read back after crashes, disk faults and other programs'
//! writes; whatever its bytes, the reader returns its records and a torn tail, or an
//! error naming the offset, never a panic, a hang or an allocation the file's length
//! does not bound.
//!
//! A bounded `#[test]` (2 s of generated inputs, after the corpus in
//! `tests/__fuzz__/<target>/corpus`), and coverage-guided on stable Rust with
//! `cargo bolero test -p sluice-fuzz <target>`: see docs/fuzzing.md.

use sluice_runtime::recovery::{FORMAT_VERSION, MAGIC, read_log_valid_len};
use std::time::Duration;

/// The log reader on any file (read back after crashes, disk faults and other programs'
/// writes): its records and a torn tail, or an error naming the offset.
#[test]
fn fuzz_read_log_returns_records_or_an_error() {
    let header: Vec<u8> = MAGIC
        .iter()
        .copied()
        .chain(FORMAT_VERSION.to_le_bytes())
        .collect();
    bolero::check!()
        .with_test_time(Duration::from_secs(2))
        .with_iterations(usize::MAX)
        .with_max_len(4096)
        .for_each(|bytes: &[u8]| {
            if let Ok(valid_len) = read_log_valid_len(bytes) {
                assert!(valid_len <= bytes.len() as u64);
            }
            // The same after a current file header, so that generated inputs reach the
            // frames.
            let mut file = header.clone();
            file.extend_from_slice(bytes);
            if let Ok(valid_len) = read_log_valid_len(&file) {
                assert!(valid_len <= file.len() as u64);
            }
        });
}
