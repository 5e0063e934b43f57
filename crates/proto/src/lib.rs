//! Wire types of the driver protocol: packages `flow` and `materialize`, and the tonic
//! `Driver` service (client and server). No logic lives here: see `sluice-driver` for
//! the protocol state machine and `shared/protocol.md` for the field numbers.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod flow {
    tonic::include_proto!("flow");
}

pub mod materialize {
    tonic::include_proto!("materialize");
}
