//! What a source kind provides to be registered, and the parsed configuration the
//! runtime keeps for each source of a pipeline.
//!
//! ```text
//!  pipeline file  sources.views: {target, file: {path: v.jsonl, format: json}}
//!                                         └─ key ─┘└──────── config ─────────┘
//!  registry       Kind "file" ──parse(config, base_dir)──▶ SourceConfig ──open(&Opening)──▶ Box<dyn Source>
//! ```
//!
//! A kind is a type implementing [`SourceKind`]; [`kind`] erases it into the [`Kind`] a
//! registry lists, so the runtime knows a source only by its key and these two calls.
//! After `parse` returns, the configuration is complete (defaults filled, relative
//! paths resolved) and checked: `open` fails only for what cannot be known without
//! opening. A [`SourceConfig`] opens as often as the runtime restarts its loop, each
//! time a source at the start of its input, and once more for `sluice check`: `open`
//! connects to nothing and binds nothing (a source does that on its first command).
//!
//! A kind that listens for its input (an HTTP server) may also provide a [`Standby`]:
//! under `cluster:` every member listens on the source's address, and a member that
//! does not hold the source's shard answers there for the holder (a refusal naming it),
//! so a client behind a load balancer finds the holder.

use crate::config::{self, InvalidConfig};
use crate::health::Health;
use crate::intake::Intake;
use crate::{Source, SourceError};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

/// The member of a cluster holding a shard, as a [`Standby`] names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its member id (`cluster.member`).
    pub member: String,
    /// The address it listens on for this source, as it published it; `None` if it
    /// published none.
    pub address: Option<String>,
}

/// What a cluster member runs on a listening source's address while another member
/// holds the source's shard: every request is refused, naming the holder. Started by
/// [`SourceConfig::standby`] (it binds in the background, waiting for the address to be
/// free); stopped before this member runs the shard itself.
#[async_trait::async_trait]
pub trait Standby: Send + Sync {
    /// The address the source listens on, for the member to publish (the configured
    /// one: clients of every member reach it there).
    fn address(&self) -> String;
    /// Who holds the shard now (`None`: nobody, between holders); what refusals name.
    fn set_holder(&self, holder: Option<Holder>);
    /// Stops listening; returns once the address is free for the source itself.
    async fn stop(self: Box<Self>);
}

/// A kind of source: its key in the pipeline file, its configuration, how to open it.
pub trait SourceKind: 'static {
    /// The key naming this kind in a source of the pipeline file (`file`, `datagen`).
    const NAME: &'static str;
    /// What the user writes under that key; strict (`deny_unknown_fields`). Its JSON
    /// schema ([`config::schema_for`]: each field's doc comment its description, its
    /// serde default its `default`) is what `sluice schema` prints and the docs'
    /// reference is made of.
    type Config: DeserializeOwned + JsonSchema + fmt::Debug + Send + Sync + 'static;

    /// What serde cannot express: cross-field checks, and making relative paths
    /// relative to the pipeline file's folder `base_dir` ([`config::resolve_path`]).
    fn prepare(config: &mut Self::Config, base_dir: &Path) -> Result<(), InvalidConfig>;

    /// Why this kind cannot move between the members of a cluster with its shard (state
    /// kept on one machine, or in one server-side slot two shards cannot share); `None`:
    /// it can (all it resumes from is in the recovery log).
    const PINNED: Option<&'static str> = None;

    /// Why a source of this kind is read by one shard only, though it can move between
    /// a cluster's members with it (all it resumes from is in the recovery log and the
    /// system it reads, as a server-side replication slot); `None`: any number of shards
    /// may read it at once. Its materialization runs as one shard, never split, with one
    /// holder at a time.
    const SINGLETON: Option<&'static str> = None;

    /// Opens the source `opening.name` at the start of its input.
    fn open(opening: &Opening<'_>, config: &Self::Config) -> Result<Box<dyn Source>, SourceError>;

    /// For a kind that listens for its input: starts the [`Standby`] of source `name` on
    /// its address (called on a Tokio runtime; it binds on a task of its own). `None`
    /// (the default): this kind does not listen.
    fn standby(_name: &str, _config: &Self::Config) -> Option<Box<dyn Standby>> {
        None
    }
}

/// What the runtime tells a source it opens: its name, and the materialization shard it
/// is opened for (each materialization reads its own instance of a source).
#[derive(Debug, Clone, Copy)]
pub struct Opening<'a> {
    /// The source's name in the pipeline file.
    pub name: &'a str,
    /// The materialization this instance feeds.
    pub materialization: &'a str,
    /// A folder of this source's own, beside the materialization's recovery log, for
    /// what it must keep across restarts outside the log (an HTTP source's idempotency
    /// keys). Created by the source when it needs it; one process holds it at a time
    /// (the recovery log's lock).
    pub state_dir: &'a Path,
    /// The shard this instance feeds may move to another machine with its recovery log
    /// (a cluster's shard, its log in etcd): `state_dir` stays on this machine, so what
    /// the source must find again after a move belongs in its resume positions.
    pub shard_moves: bool,
    /// The run keeps reading once its sources caught up (`sluice run --follow`): a
    /// source that can tail its input (a file) tails it, as its own setting would.
    pub follow: bool,
    /// The check of a document against the collection the source feeds, and what the
    /// runtime does with one that fails it ([`Intake`]): for a source that can refuse
    /// bad input where it comes in (an HTTP source answers its client 400). Every
    /// source the runtime runs gets one; `None` for a source opened outside a pipeline
    /// (tests, tools) or only to be looked at (admission).
    pub intake: Option<&'a Intake>,
    /// Where a source that retries inside a call (a client backing off until its own
    /// deadline) reports its connection, so the runtime can show it ([`Health`]);
    /// [`Health::none`] outside a pipeline.
    pub health: &'a Health,
    /// The key hashes of the shards this instance feeds, and how a record's key hash is
    /// read: for a source whose partitions map to key ranges, which reads only the
    /// partitions overlapping them ([`ShardKeys`]). Every source the runtime runs gets
    /// one; `None` outside a pipeline or only to be looked at: read everything.
    pub shard_keys: Option<&'a ShardKeys>,
}

/// A record's key hash read from its JSON text, if it has a key to read.
type KeyHash = dyn Fn(&[u8]) -> Option<u32> + Send + Sync;

/// The key hashes of the shards a source instance feeds (a cluster's shard, a
/// member's shards together, or a process's local shards together): disjoint
/// inclusive ranges `[begin, end]` in key order, and the key hash of a record as the
/// runtime's reader routes it. A partitioned source reads only the partitions whose
/// keys fall in the ranges, and checks that each record's key is one its partition
/// holds. The reader still routes every record by its key, so a source that reads more
/// than its ranges loses nothing; one that reads less would. Cheap to clone.
#[derive(Clone)]
pub struct ShardKeys {
    ranges: Arc<[(u32, u32)]>,
    hash: Arc<KeyHash>,
}

impl ShardKeys {
    /// The ranges `[begin, end]` (disjoint, in key order), with `hash` reading a
    /// record's key hash from its text (`None`: no key to read there: not JSON, no
    /// key, or an envelope with nothing to apply; the reader reports what is wrong with
    /// it).
    ///
    /// Panics when `ranges` is empty, unordered or overlapping.
    pub fn new(
        ranges: impl IntoIterator<Item = (u32, u32)>,
        hash: impl Fn(&[u8]) -> Option<u32> + Send + Sync + 'static,
    ) -> ShardKeys {
        let ranges: Arc<[(u32, u32)]> = ranges.into_iter().collect();
        assert!(!ranges.is_empty(), "shard keys without a range");
        assert!(
            ranges.iter().all(|(begin, end)| begin <= end)
                && ranges.windows(2).all(|w| w[0].1 < w[1].0),
            "shard key ranges out of order: {ranges:x?}"
        );
        ShardKeys {
            ranges,
            hash: Arc::new(hash),
        }
    }

    /// The ranges `[begin, end]`, disjoint, in key order.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    /// The key hash of the record `text`, as the reader routes it.
    pub fn key_hash(&self, text: &[u8]) -> Option<u32> {
        (self.hash)(text)
    }
}

impl fmt::Debug for ShardKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges: Vec<String> = (self.ranges.iter())
            .map(|(begin, end)| format!("{begin:08x}-{end:08x}"))
            .collect();
        write!(f, "ShardKeys({})", ranges.join(", "))
    }
}

impl<'a> Opening<'a> {
    /// An opening for tests and tools that run a source outside a pipeline: its state
    /// in `state_dir`, for a materialization named after the source.
    pub fn standalone(name: &'a str, state_dir: &'a Path) -> Opening<'a> {
        Opening {
            name,
            materialization: name,
            state_dir,
            shard_moves: false,
            follow: false,
            intake: None,
            health: Health::none(),
            shard_keys: None,
        }
    }
}

/// A source kind as a registry lists it (see [`kind`]).
#[derive(Clone, Copy)]
pub struct Kind {
    name: &'static str,
    schema: fn() -> Value,
    pinned: Option<&'static str>,
    singleton: Option<&'static str>,
    parse: fn(Value, &Path) -> Result<SourceConfig, InvalidConfig>,
}

/// The registry entry of the source kind `K`.
pub fn kind<K: SourceKind>() -> Kind {
    Kind {
        name: K::NAME,
        schema: config::schema_for::<K::Config>,
        pinned: K::PINNED,
        singleton: K::SINGLETON,
        parse: parse_as::<K>,
    }
}

fn parse_as<K: SourceKind>(value: Value, base_dir: &Path) -> Result<SourceConfig, InvalidConfig> {
    let mut config: K::Config = config::parse(value)?;
    K::prepare(&mut config, base_dir)?;
    Ok(SourceConfig(Arc::new(Typed::<K>(config, PhantomData))))
}

impl Kind {
    /// The key naming this kind in the pipeline file.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The JSON schema of the configuration written under this kind's key.
    pub fn schema(&self) -> Value {
        (self.schema)()
    }

    /// Why a source of this kind cannot run in a cluster ([`SourceKind::PINNED`]).
    pub fn pinned(&self) -> Option<&'static str> {
        self.pinned
    }

    /// Why a source of this kind is read by one shard only
    /// ([`SourceKind::SINGLETON`]).
    pub fn singleton(&self) -> Option<&'static str> {
        self.singleton
    }

    /// Reads the configuration written under this kind's key; relative paths are
    /// relative to `base_dir`. Errors name their place inside `config`.
    pub fn parse(&self, config: Value, base_dir: &Path) -> Result<SourceConfig, InvalidConfig> {
        (self.parse)(config, base_dir)
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Kind").field(&self.name).finish()
    }
}

/// The parsed configuration of one source, and the kind that opens it.
#[derive(Clone)]
pub struct SourceConfig(Arc<dyn Parsed>);

/// A configuration of some kind `K` ([`Typed`]), its type erased.
trait Parsed: Send + Sync {
    fn kind(&self) -> &'static str;
    fn open(&self, opening: &Opening<'_>) -> Result<Box<dyn Source>, SourceError>;
    fn standby(&self, name: &str) -> Option<Box<dyn Standby>>;
    fn config(&self) -> &dyn Any;
    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

struct Typed<K: SourceKind>(K::Config, PhantomData<fn() -> K>);

impl<K: SourceKind> Parsed for Typed<K> {
    fn kind(&self) -> &'static str {
        K::NAME
    }

    fn open(&self, opening: &Opening<'_>) -> Result<Box<dyn Source>, SourceError> {
        K::open(opening, &self.0)
    }

    fn standby(&self, name: &str) -> Option<Box<dyn Standby>> {
        K::standby(name, &self.0)
    }

    fn config(&self) -> &dyn Any {
        &self.0
    }

    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl SourceConfig {
    /// The key of the source's kind (`file`).
    pub fn kind(&self) -> &'static str {
        self.0.kind()
    }

    /// Opens the source `opening.name` at the start of its input.
    pub fn open(&self, opening: &Opening<'_>) -> Result<Box<dyn Source>, SourceError> {
        self.0.open(opening)
    }

    /// Starts the [`Standby`] of source `name` if its kind listens
    /// ([`SourceKind::standby`]).
    pub fn standby(&self, name: &str) -> Option<Box<dyn Standby>> {
        self.0.standby(name)
    }

    /// The configuration, if its kind's configuration type is `C`.
    pub fn get<C: 'static>(&self) -> Option<&C> {
        self.0.config().downcast_ref()
    }
}

impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind())?;
        self.0.debug(f)
    }
}
