//! Sluice as a cluster: processes of one pipeline file share its materializations'
//! shards through etcd, as Estuary Flow's do through Gazette and etcd (no consensus of
//! our own). A member registers with a lease, claims the shards rendezvous hashing
//! gives it by compare-and-swap (the assignment's revision is the fencing token),
//! runs each on the runtime's one loop over a recovery log kept in etcd, and hands
//! shards over, splits them, or loses them with its lease.
//!
//! - `etcd.rs`: our etcd v3 client (keys, transactions, leases) over `proto/etcd.proto`
//! - `keys.rs`: the key layout, shard ids and ranges (pure)
//! - `assign.rs`: who owns which shard and what a member does about it (pure)
//! - `autosplit.rs`: when a shard whose lag stays high splits itself (pure)
//! - `balance.rs`: shards weighed by load: the one move, if any, from the busiest
//!   member to the least busy (pure)
//! - `load.rs`: a member's CPU use, published with its lease, and read back
//! - `log.rs`: a shard's recovery log in etcd, every write fenced by the claim
//! - `pack.rs`: an intent as etcd stores it, each step's position a patch of the one
//!   before (pure)
//! - `member/`: the member: the reconcile loop; `join.rs` (first shards, deployment id,
//!   first Apply), `loops.rs` (the held shards' loops: those whose logs agree share
//!   one read), `moves.rs` (handover, moves by load, splits)
//! - `standby.rs`: every member listens for a listening source (HTTP); the ones not
//!   holding its shard answer naming the holder
//! - `wake.rs`: what wakes the reconcile loop: etcd watches of the keys it reads, its
//!   loops ending, a safety net
//! - `admin.rs`: `sluice shards list | split`
//! - `apply.rs`: `sluice apply [--delete]` on the cluster's etcd: a changed spec recorded
//!   in it, or every key of a materialization removed (a reset), while no member runs
//! - `testing.rs` (feature `testing`): a private etcd member for tests

pub mod admin;
pub mod apply;
pub mod assign;
pub mod autosplit;
pub mod balance;
pub mod etcd;
pub mod keys;
pub mod load;
pub mod log;
pub mod member;
pub mod pack;
pub mod standby;
pub mod wake;

pub use member::{ClusterError, connect, run};
