//! Fuzz target of the stdio transport's frame reader (issue 34): whatever bytes a driver
//! (or the runtime) writes, `read_frame` returns a message, a clean end, or an error:
//! never a panic, a hang, or an allocation past `MAX_WIRE_MESSAGE_BYTES` (the length is
//! checked before the body is allocated).
//!
//! A bounded `#[test]` (2 s of generated inputs after the corpus in
//! `tests/__fuzz__/<target>/corpus`), and coverage-guided on stable Rust with
//! `cargo bolero test -p sluice-fuzz <target>`: see docs/fuzzing.md.

use sluice_driver_sdk::materialize as m;
use sluice_driver_sdk::stdio::read_frame;
use std::time::Duration;

/// How long the target generates inputs in a normal test run.
const TEST_TIME: Duration = Duration::from_secs(2);

/// Reads frames of `M` from `bytes` until the end or the first error, as a peer's reader
/// does: every frame either decodes or stops the stream with an error.
fn read_all<M: prost::Message + Default>(bytes: &[u8]) {
    let mut input = bytes;
    let mut frames = 0usize;
    loop {
        match futures::executor::block_on(read_frame::<_, M>(&mut input)) {
            Ok(Some(_)) => frames += 1,
            Ok(None) | Err(_) => break,
        }
        // Each frame takes at least its 4-byte prefix, so the reader always advances.
        assert!(
            frames * 4 <= bytes.len(),
            "more frames than the bytes can hold"
        );
    }
}

/// Frames of every message the two peers read from each other over stdio.
#[test]
fn fuzz_stdio_frames_decode_or_fail() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(4096)
        .for_each(|bytes: &[u8]| {
            read_all::<m::TransactionRequest>(bytes);
            read_all::<m::TransactionResponse>(bytes);
            read_all::<m::SpecResponse>(bytes);
            read_all::<m::ValidateRequest>(bytes);
            read_all::<m::ValidateResponse>(bytes);
            read_all::<m::ApplyRequest>(bytes);
            read_all::<m::ApplyResponse>(bytes);
        });
}
