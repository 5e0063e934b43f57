//! Wire types of the driver protocol, in its two versions, and their tonic services
//! (client and server). No logic lives here: see `sluice-driver-sdk` for the protocol
//! state machine and the translation between the two, and `shared/protocol.md` and
//! `docs/protocol.md` for the field numbers.
//!
//! - [`flow`], [`materialize`]: the seed's protocol (`materialize.Driver`, its
//!   `Transactions` stream), which is also what the runtime and the driver SDK speak
//!   inside, with Sluice's extensions (field numbers from 100 up, which a peer of that
//!   protocol skips).
//! - [`current`]: Flow's protocol of today (`materialize.Connector/Materialize`, one
//!   stream of `Request` and `Response`), translated to and from the seed's at the edge.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod flow {
    include!(concat!(env!("OUT_DIR"), "/seed/flow.rs"));
}

pub mod materialize {
    include!(concat!(env!("OUT_DIR"), "/seed/materialize.rs"));
}

/// Flow's current materialization protocol.
pub mod current {
    pub mod consumer {
        include!(concat!(env!("OUT_DIR"), "/current/consumer.rs"));
    }

    pub mod flow {
        include!(concat!(env!("OUT_DIR"), "/current/flow.rs"));
    }

    pub mod materialize {
        include!(concat!(env!("OUT_DIR"), "/current/materialize.rs"));
    }

    /// The encoded `FileDescriptorSet` of the current protocol's packages (imports
    /// included): what the JSON codec of `sluice-driver-sdk` reflects over.
    pub const DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/current/descriptors.bin"));

    /// The `protocol` a current connector's Spec response carries.
    pub const PROTOCOL: u32 = 3032023;
}
