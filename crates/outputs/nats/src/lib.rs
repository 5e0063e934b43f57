//! The nats output (being written).

/// The `nats` endpoint kind.
pub fn kind() -> sluice_output_sdk::OutputKind {
    unimplemented!()
}
