//! The Redis driver: each key's reduced document under `<prefix><hex of the packed
//! key>`, as a JSON string (`format: json`) or a hash of the selected fields plus the
//! document (`format: hash`).
//!
//! It follows [`sluice_driver_sdk::CommitPattern::RecoveryLogNonTransactional`]: Redis
//! holds no checkpoint and no fence; the runtime's recovery log does. Loads run after the
//! prior transaction's acknowledgement; stores are staged and written at commit, last
//! write wins by key. A replay rewrites full documents (effectively once), but a
//! reduction that adds to the loaded document (`sum`) counts a replayed transaction
//! twice, so the driver runs only under `delivery: at_least_once`. Delta-updates bindings
//! are refused: a replayed append would double.
//!
//! The standard connector layout:
//! - [`config`]: what the user writes and its JSON schemas;
//! - [`driver`]: Spec, Validate, Apply and Open;
//! - `transactor`: loads, the staged stores and the commit;
//! - `stage`: a transaction's stores, bounded in memory, the rest in a temporary file;
//! - `client`: the connection and the commands, in bounded pipelines;
//! - [`key`]: the key encoding.

pub mod client;
pub mod config;
pub mod driver;
pub mod key;
mod stage;
mod transactor;

pub use driver::RedisDriver;
