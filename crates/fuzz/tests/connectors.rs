//! Fuzz targets of the decoders of what connector processes and replication servers
//! send (a line of an Airbyte connector or a Singer tap; a MariaDB GTID state as the
//! server prints it): whatever the bytes, each returns a message, a value or an error,
//! never a panic.
//!
//! Each target is a bounded `#[test]` (2 s of generated inputs, after the corpus in
//! `tests/__fuzz__/<target>/corpus`), and runs coverage-guided with
//! `cargo bolero test -p sluice-fuzz --test connectors <target>`: see docs/fuzzing.md.

use sluice_airbyte_source::{Airbyte, Protocol, Singer};
use sluice_mysql_cdc::position::GtidState;
use std::time::Duration;

/// How long each target generates inputs in a normal test run.
const TEST_TIME: Duration = Duration::from_secs(2);

/// Longest generated input: a line of a connector is one JSON message.
const MAX_LEN: usize = 4096;

/// A line of an Airbyte connector's or a Singer tap's output: a message or a JSON error.
#[test]
fn fuzz_connector_lines_parse_or_fail() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let _ = Airbyte::parse(bytes);
            let _ = Singer::parse(bytes);
        });
}

/// A GTID state's text (`0-1-17,2-5-3`): parsed or declined, and what parses prints
/// back as text that parses to the same state.
#[test]
fn fuzz_gtid_states_parse_or_decline() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let Ok(text) = std::str::from_utf8(bytes) else {
                return;
            };
            if let Some(state) = GtidState::parse(text) {
                let printed = state.to_string();
                assert_eq!(GtidState::parse(&printed), Some(state), "{printed:?}");
            }
        });
}
