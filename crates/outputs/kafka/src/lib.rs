//! The kafka output (being written).

/// The `kafka` endpoint kind.
pub fn kind() -> sluice_output_sdk::OutputKind {
    unimplemented!()
}
