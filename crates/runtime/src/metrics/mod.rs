//! Prometheus metrics: every metric the runtime exports is named here, with its help
//! text and labels, and recorded through the handles of one shard ([`ShardMetrics`]),
//! resolved once per run so the loop never looks a label set up on its hot path.
//! [`exporter`] serves them (`runtime.metrics`, `sluice run --metrics`), with the
//! [`status`] the same handles record; [`ended`] keeps what a shard's loop left when it
//! ended beside its recovery log. Each source's handles carry the
//! [`Health`](sluice_source_sdk::Health) it is opened with, which reports into the status.
//!
//! Prometheus' conventions: the `sluice_` prefix, the base unit in the name (`_seconds`,
//! `_bytes`), counters ending in `_total`. Labels name the materialization, its shard
//! (`<key_begin hex>-<key_end hex>`), a binding (its resource path), a source, or one of
//! a fixed few values (`phase`, `kind`, `combiner`); never a key or a transaction
//! number: the pipeline file bounds the number of series.
//!
//! Health (`sluice_source_health`, `sluice_endpoint_health`) is a gauge per part, set
//! from the [`status`] when scraped: 0 healthy, 1 unhealthy, 2 fatal
//! ([`HealthState::code`](sluice_source_sdk::HealthState::code)). Parse errors, a
//! source's memory and its own metrics (`Source::metrics`) are counted or sampled as the
//! reader sees them, in the group's first shard (the one whose `Health` its sources
//! report to): a source's own metrics as `sluice_source_custom{name, …}` (gauges) and
//! `sluice_source_custom_counter_total{name, …}` (counters), one family each, so that their
//! series carry the source's labels and no source can clash with a runtime metric.
//! An endpoint reports the same of itself after each transaction it commits
//! ([`Report`](sluice_driver_sdk::Report), `Transactor::report`, in-process drivers only): its memory as
//! `sluice_endpoint_memory_bytes`, its own metrics as `sluice_endpoint_custom{name, …}` and
//! `sluice_endpoint_custom_counter_total{name, …}` (labelled with the shard, which names
//! the endpoint), and its health into the endpoint's tracker.
//!
//! Counted once committed: a transaction's documents, bytes, loads, stores and dead
//! letters are added when its driver has committed it, as the run's summary counts them,
//! so the counters agree with the summary and a restart never counts a document twice.

mod committed;
pub mod ended;
pub mod exporter;
pub mod status;

pub(crate) use committed::Committed;

use crate::types::{RunError, Shard, materialization_name, shard_label};
use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};
use sluice_doc::combine::CombinerStats;
use sluice_driver_sdk::Report as EndpointReport;
use sluice_source_sdk::health::Report;
use sluice_source_sdk::{Connection, Health, Lag};
use sluice_source_sdk::{HealthState, MetricKind};
use status::{Part, ShardStatus, SourceState, State, Status};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    materialization: String,
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    source: String,
}

/// A source's own metric: its name, and the labels it gives beside the source's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CustomLabels {
    #[prometheus(flatten)]
    source: SourceLabels,
    name: String,
    #[prometheus(flatten)]
    labels: Vec<(String, String)>,
}

/// An endpoint's own metric: its name, and the labels it gives beside the shard's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointCustomLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    name: String,
    #[prometheus(flatten)]
    labels: Vec<(String, String)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BindingLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    binding: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CombinerLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    combiner: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    #[prometheus(flatten)]
    shard: ShardLabels,
    kind: &'static str,
}

/// The timed phases of a transaction (`phase` label of `sluice_transaction_phase_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The reader filling the batch: from its start to its close.
    Read,
    /// Draining the batch into Loads, until the last Load is sent.
    Loads,
    /// From the last Load to Prepared (which waits for the prior Acknowledged first).
    Prepare,
    /// Draining the reduced documents into Stores.
    Store,
    /// Commit to DriverCommitted.
    Commit,
    /// Writing and fsync'ing the commit record of the recovery log.
    LogCommit,
    /// Acknowledge to Acknowledged, when the loop waits for it (not one sent while idle).
    Acknowledge,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Read,
        Phase::Loads,
        Phase::Prepare,
        Phase::Store,
        Phase::Commit,
        Phase::LogCommit,
        Phase::Acknowledge,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Read => "read",
            Phase::Loads => "loads",
            Phase::Prepare => "prepare",
            Phase::Store => "store",
            Phase::Commit => "commit",
            Phase::LogCommit => "log_commit",
            Phase::Acknowledge => "acknowledge",
        }
    }
}

/// The combiners of a transaction (`combiner` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CombinerRole {
    /// The reader's (C1): the batch's documents, combined.
    Read,
    /// The load phase's (C2): loaded documents reduced with the batch's.
    Load,
}

impl CombinerRole {
    fn label(self) -> &'static str {
        match self {
            CombinerRole::Read => "read",
            CombinerRole::Load => "load",
        }
    }
}

/// 1 ms to about 2 minutes, doubling: from a local store's commit to a slow backfill's
/// end-to-end latency.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

type Histograms<S> = Family<S, Histogram, fn() -> Histogram>;

fn histograms<S: Clone + std::hash::Hash + Eq>() -> Histograms<S> {
    Family::new_with_constructor(seconds_histogram)
}

/// Every metric of the process, and the registry that writes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    source_documents: Family<SourceLabels, Counter>,
    source_bytes: Family<SourceLabels, Counter>,
    source_dead_lettered: Family<SourceLabels, Counter>,
    source_lag_bytes: Family<SourceLabels, Gauge>,
    source_lag_messages: Family<SourceLabels, Gauge>,
    source_retained_bytes: Family<SourceLabels, Gauge>,
    source_health: Family<SourceLabels, Gauge>,
    source_parse_errors: Family<SourceLabels, Counter>,
    source_memory: Family<SourceLabels, Gauge>,
    source_custom: Family<CustomLabels, Gauge>,
    source_custom_total: Family<CustomLabels, Counter>,
    endpoint_health: Family<ShardLabels, Gauge>,
    endpoint_memory: Family<ShardLabels, Gauge>,
    endpoint_custom: Family<EndpointCustomLabels, Gauge>,
    endpoint_custom_total: Family<EndpointCustomLabels, Counter>,
    binding_combined: Family<BindingLabels, Counter>,
    binding_loaded: Family<BindingLabels, Counter>,
    binding_stored: Family<BindingLabels, Counter>,
    binding_deleted: Family<BindingLabels, Counter>,
    transactions: Family<ShardLabels, Counter>,
    phase_seconds: Histograms<PhaseLabels>,
    end_to_end_seconds: Histograms<ShardLabels>,
    combiner_memory: Family<CombinerLabels, Gauge>,
    combiner_spilled: Family<CombinerLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    retries: Family<KindLabels, Counter>,
    /// What `/api/status` serves.
    pub status: Status,
}

/// Registers `metric` as `sluice_<name>[_<unit>]` (a counter gets `_total` when
/// written) with its help text.
fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    unit: Option<Unit>,
    help: &str,
    metric: M,
) -> M {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric.clone()),
        None => registry.register(name, help, metric.clone()),
    }
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("sluice");
        let bytes = || Some(Unit::Bytes);
        let seconds = || Some(Unit::Seconds);
        Metrics {
            source_documents: register(
                &mut r,
                "source_documents_read",
                None,
                "Documents read from the source, in committed transactions.",
                Family::default(),
            ),
            source_bytes: register(
                &mut r,
                "source_read",
                bytes(),
                "Bytes read from the source, in committed transactions.",
                Family::default(),
            ),
            source_dead_lettered: register(
                &mut r,
                "source_documents_dead_lettered",
                None,
                "Documents of the source rejected into its dead-letter file \
                 (on_error: skip), in committed transactions.",
                Family::default(),
            ),
            source_lag_bytes: register(
                &mut r,
                "source_lag",
                bytes(),
                "Bytes the source is behind its input, as of its last step (a file's \
                 unread bytes).",
                Family::default(),
            ),
            source_lag_messages: register(
                &mut r,
                "source_lag",
                Some(Unit::Other("messages".into())),
                "Messages the source is behind its input, as of its last step (Kafka \
                 offsets, NATS stream sequences).",
                Family::default(),
            ),
            source_retained_bytes: register(
                &mut r,
                "source_retained",
                bytes(),
                "Bytes of input the system a source reads keeps for it and has not \
                 released, as of its last step (the WAL a PostgreSQL replication slot \
                 holds back, from its restart_lsn).",
                Family::default(),
            ),
            source_health: register(
                &mut r,
                "source_health",
                None,
                "The source's health: 0 healthy, 1 unhealthy (it cannot read now: it \
                 backs off, or the loop reopens on its error), 2 fatal (the run ended on \
                 its error). The reason is in /api/status.",
                Family::default(),
            ),
            source_parse_errors: register(
                &mut r,
                "source_parse_errors",
                None,
                "Records of the source that did not parse (bad JSON, a bad envelope) or \
                 that it refused (its step's input errors), as read: a step read again \
                 counts again.",
                Family::default(),
            ),
            source_memory: register(
                &mut r,
                "source_memory",
                bytes(),
                "Memory the source holds (its read-ahead buffer), as it last said.",
                Family::default(),
            ),
            source_custom: register(
                &mut r,
                "source_custom",
                None,
                "A source's own gauge, named by the name label (a broker's lag per \
                 partition, messages a consumer has pending); its help is in /api/status.",
                Family::default(),
            ),
            source_custom_total: register(
                &mut r,
                "source_custom_counter",
                None,
                "A source's own counter, named by the name label, since that instance of \
                 the source was opened; its help is in /api/status.",
                Family::default(),
            ),
            endpoint_health: register(
                &mut r,
                "endpoint_health",
                None,
                "The health of the shard's endpoint (its materialization's driver or \
                 output): 0 healthy, 1 unhealthy (the loop reopens on its error), 2 fatal \
                 (the run ended on its error). The reason is in /api/status.",
                Family::default(),
            ),
            endpoint_memory: register(
                &mut r,
                "endpoint_memory",
                bytes(),
                "Memory the shard's endpoint holds (its staging, an encode buffer), as it \
                 last reported after a commit (in-process drivers only).",
                Family::default(),
            ),
            endpoint_custom: register(
                &mut r,
                "endpoint_custom",
                None,
                "An endpoint's own gauge, named by the name label, as it last reported \
                 after a commit; its help is in /api/status.",
                Family::default(),
            ),
            endpoint_custom_total: register(
                &mut r,
                "endpoint_custom_counter",
                None,
                "An endpoint's own counter, named by the name label, since that instance \
                 of its driver's stream was opened; its help is in /api/status.",
                Family::default(),
            ),
            binding_combined: register(
                &mut r,
                "binding_documents_combined",
                None,
                "Documents combined into the binding (before reduction by key), in \
                 committed transactions.",
                Family::default(),
            ),
            binding_loaded: register(
                &mut r,
                "binding_documents_loaded",
                None,
                "Documents the driver loaded for the binding, in committed transactions.",
                Family::default(),
            ),
            binding_stored: register(
                &mut r,
                "binding_documents_stored",
                None,
                "Documents stored to the binding (deletions included), in committed \
                 transactions.",
                Family::default(),
            ),
            binding_deleted: register(
                &mut r,
                "binding_documents_deleted",
                None,
                "Deletions stored to the binding, in committed transactions.",
                Family::default(),
            ),
            transactions: register(
                &mut r,
                "transactions_committed",
                None,
                "Transactions the driver committed.",
                Family::default(),
            ),
            phase_seconds: register(
                &mut r,
                "transaction_phase",
                seconds(),
                "Duration of each phase of a committed transaction: read, loads, \
                 prepare, store, commit, log_commit, acknowledge.",
                histograms(),
            ),
            end_to_end_seconds: register(
                &mut r,
                "end_to_end_latency",
                seconds(),
                "From the moment a transaction's first document was read from its \
                 source to the moment its commit was durable in the recovery log.",
                histograms(),
            ),
            combiner_memory: register(
                &mut r,
                "combiner_memory",
                bytes(),
                "Memory the last transaction's combiner held: the reader's (read) when \
                 its batch closed, the load phase's (load) when its loads ended.",
                Family::default(),
            ),
            combiner_spilled: register(
                &mut r,
                "combiner_spilled",
                bytes(),
                "Bytes combiners spilled to disk beyond their memory budget.",
                Family::default(),
            ),
            errors: register(
                &mut r,
                "errors",
                None,
                "Runs of the loop that ended with an error, by its kind.",
                Family::default(),
            ),
            retries: register(
                &mut r,
                "retries",
                None,
                "Reopenings of the loop after a retryable error, by its kind.",
                Family::default(),
            ),
            registry: r,
            status: Status::default(),
        }
    }

    /// Every metric, in Prometheus' text format 0.0.4.
    pub fn render(&self) -> String {
        self.set_health();
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry).expect("a String takes any text");
        text
    }

    /// The health gauges, from the status (its trackers are the one account of health).
    fn set_health(&self) {
        for (materialization, shard, parts) in self.status.healths() {
            let shard = ShardLabels {
                materialization,
                shard,
            };
            for (source, code) in parts {
                let gauge = match source {
                    Some(source) => self.source_health.get_or_create_owned(&SourceLabels {
                        shard: shard.clone(),
                        source,
                    }),
                    None => self.endpoint_health.get_or_create_owned(&shard),
                };
                gauge.set(code);
            }
        }
    }

    /// The handles of one shard, whose sources are `sources` (names, in the order the
    /// loop's `Context::sources` has them).
    pub fn shard<'a>(
        &self,
        shard: &Shard,
        sources: impl IntoIterator<Item = &'a str>,
    ) -> ShardMetrics {
        let open = &shard.open;
        let labels = ShardLabels {
            materialization: materialization_name(open),
            shard: shard_label(open.key_begin, open.key_end),
        };
        let sources: Vec<String> = sources.into_iter().map(str::to_string).collect();
        let status = (self.status).shard(
            labels.materialization.clone(),
            labels.shard.clone(),
            sources.clone(),
            (shard.bindings.iter())
                .map(|b| (b.resource.clone(), b.collection.name.clone()))
                .collect(),
        );
        let phases = Phase::ALL.map(|phase| {
            self.phase_seconds.get_or_create_owned(&PhaseLabels {
                shard: labels.clone(),
                phase: phase.label(),
            })
        });
        let combiner = |role: CombinerRole| {
            let of = CombinerLabels {
                shard: labels.clone(),
                combiner: role.label(),
            };
            CombinerMetrics {
                memory: self.combiner_memory.get_or_create_owned(&of),
                spilled: self.combiner_spilled.get_or_create_owned(&of),
            }
        };
        let sources = sources
            .into_iter()
            .map(|source| {
                let health = Health::new(Arc::new(SourceHealth {
                    status: status.clone(),
                    source: source.clone(),
                }));
                let of = SourceLabels {
                    shard: labels.clone(),
                    source,
                };
                SourceMetrics {
                    health,
                    documents: self.source_documents.get_or_create_owned(&of),
                    bytes: self.source_bytes.get_or_create_owned(&of),
                    dead_lettered: self.source_dead_lettered.get_or_create_owned(&of),
                    lag_bytes: self.source_lag_bytes.clone(),
                    lag_messages: self.source_lag_messages.clone(),
                    retained: self.source_retained_bytes.clone(),
                    parse_errors: self.source_parse_errors.get_or_create_owned(&of),
                    memory: self.source_memory.get_or_create_owned(&of),
                    custom: self.source_custom.clone(),
                    custom_total: self.source_custom_total.clone(),
                    sampled_at: Mutex::new(None),
                    labels: of,
                    status: status.clone(),
                }
            })
            .collect();
        let bindings = shard
            .bindings
            .iter()
            .map(|binding| {
                let of = BindingLabels {
                    shard: labels.clone(),
                    binding: binding.resource.clone(),
                };
                BindingMetrics {
                    combined: self.binding_combined.get_or_create_owned(&of),
                    loaded: self.binding_loaded.get_or_create_owned(&of),
                    stored: self.binding_stored.get_or_create_owned(&of),
                    deleted: self.binding_deleted.get_or_create_owned(&of),
                }
            })
            .collect();
        let endpoint = EndpointMetrics {
            memory: self.endpoint_memory.get_or_create_owned(&labels),
            custom: self.endpoint_custom.clone(),
            custom_total: self.endpoint_custom_total.clone(),
        };
        ShardMetrics {
            endpoint,
            transactions: self.transactions.get_or_create_owned(&labels),
            end_to_end: self.end_to_end_seconds.get_or_create_owned(&labels),
            phases,
            combiners: [combiner(CombinerRole::Read), combiner(CombinerRole::Load)],
            sources,
            bindings,
            errors: self.errors.clone(),
            retries: self.retries.clone(),
            labels,
            status,
        }
    }
}

/// One shard's handles, resolved once (see [`Metrics::shard`]).
#[derive(Debug)]
pub struct ShardMetrics {
    labels: ShardLabels,
    endpoint: EndpointMetrics,
    transactions: Counter,
    /// Indexed by [`Phase`] (declared in the order of [`Phase::ALL`]).
    phases: [Histogram; Phase::ALL.len()],
    end_to_end: Histogram,
    /// Indexed by [`CombinerRole`].
    combiners: [CombinerMetrics; 2],
    /// In the order of the loop's sources.
    pub(crate) sources: Vec<SourceMetrics>,
    /// In the order of the shard's bindings.
    pub(crate) bindings: Vec<BindingMetrics>,
    errors: Family<KindLabels, Counter>,
    retries: Family<KindLabels, Counter>,
    pub(crate) status: Arc<ShardStatus>,
}

/// The endpoint's memory and own metrics, each custom series created on its first report.
#[derive(Debug)]
struct EndpointMetrics {
    memory: Gauge,
    custom: Family<EndpointCustomLabels, Gauge>,
    custom_total: Family<EndpointCustomLabels, Counter>,
}

#[derive(Debug)]
struct CombinerMetrics {
    memory: Gauge,
    spilled: Counter,
}

#[derive(Debug)]
pub(crate) struct SourceMetrics {
    documents: Counter,
    bytes: Counter,
    dead_lettered: Counter,
    /// What the source is opened with, to report its connection into the status.
    pub health: Health,
    /// Created on the first report: a source that never knows its lag has no series.
    lag_bytes: Family<SourceLabels, Gauge>,
    lag_messages: Family<SourceLabels, Gauge>,
    /// Created on the first report, likewise.
    retained: Family<SourceLabels, Gauge>,
    parse_errors: Counter,
    memory: Gauge,
    /// The source's own metrics, each series created on its first report.
    custom: Family<CustomLabels, Gauge>,
    custom_total: Family<CustomLabels, Counter>,
    /// When its memory and own metrics were last sampled ([`SAMPLE_EVERY`]).
    sampled_at: Mutex<Option<Instant>>,
    labels: SourceLabels,
    status: Arc<ShardStatus>,
}

#[derive(Debug)]
pub(crate) struct BindingMetrics {
    combined: Counter,
    loaded: Counter,
    stored: Counter,
    deleted: Counter,
}

/// A source's [`Health`] reports, into its shard's status.
struct SourceHealth {
    status: Arc<ShardStatus>,
    source: String,
}

impl Report for SourceHealth {
    fn report(&self, connection: Connection) {
        self.status.connection(&self.source, connection);
    }

    fn health(&self, state: HealthState) {
        self.status.said(&self.source, state);
    }
}

/// A source's memory and own metrics are sampled at most this often: asking builds a
/// list (a Kafka source's has a series per partition), and the reader asks after every
/// step, far more often than anyone scrapes.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The part of the shard whose call `err` is: its source's, its endpoint's (the driver's
/// calls, what it loaded, its checkpoint), or the loop's own.
fn culprit(err: &RunError) -> Part<'_> {
    if let Some(source) = err.source_name() {
        return Part::Source(source);
    }
    match err {
        RunError::Driver { .. }
        | RunError::Loaded { .. }
        | RunError::StoreCheckpoint { .. }
        | RunError::StoreLost { .. }
        | RunError::OpenAfterCommits { .. } => Part::Endpoint,
        _ => Part::Loop,
    }
}

impl ShardMetrics {
    /// A new attempt of the loop opens its sources.
    pub(crate) fn opening(&self) {
        self.status.opening();
    }

    pub(crate) fn observe(&self, phase: Phase, took: Duration) {
        self.phases[phase as usize].observe(took.as_secs_f64());
    }

    pub(crate) fn end_to_end(&self, took: Duration) {
        self.end_to_end.observe(took.as_secs_f64());
    }

    /// A transaction's combiner, as it was when it was done with.
    pub(crate) fn combiner(&self, role: CombinerRole, stats: &CombinerStats) {
        let combiner = &self.combiners[role as usize];
        combiner
            .memory
            .set(saturating_i64(stats.memory_bytes as u64));
        combiner.spilled.inc_by(stats.spilled_bytes);
        (self.status).combiner_memory(role, stats.memory_bytes as u64);
    }

    /// What the endpoint reported of itself after a commit
    /// ([`sluice_driver_sdk::Transactor::report`]).
    pub(crate) fn reported(&self, report: &EndpointReport) {
        let endpoint = &self.endpoint;
        endpoint.memory.set(saturating_i64(report.memory));
        record_custom(
            &endpoint.custom,
            &endpoint.custom_total,
            &report.metrics,
            |name, labels| EndpointCustomLabels {
                shard: self.labels.clone(),
                name,
                labels,
            },
        );
        self.status.reported(report);
    }

    /// A run of the loop ended with `err`; `retried`: it is reopened.
    pub(crate) fn failed(&self, err: &RunError, retried: bool) {
        let of = KindLabels {
            shard: self.labels.clone(),
            kind: err.kind(),
        };
        self.errors.get_or_create(&of).inc();
        if retried {
            self.retries.get_or_create(&of).inc();
        }
        (self.status).failed(err.kind(), err.to_string(), retried, culprit(err));
    }

    /// The loop ended: `Stopped` if well, else `Failed` (its error already recorded).
    pub(crate) fn ended(&self, ok: bool) {
        self.status
            .enter(if ok { State::Stopped } else { State::Failed });
    }
}

impl SourceMetrics {
    /// The source's last step left it in `state`.
    pub(crate) fn stepped(&self, state: SourceState) {
        self.status.stepped(&self.labels.source, state);
    }

    pub(crate) fn lag(&self, lag: Lag) {
        self.status.lag(&self.labels.source, lag);
        let (family, behind) = match lag {
            Lag::Bytes(n) => (&self.lag_bytes, n),
            Lag::Messages(n) => (&self.lag_messages, n),
        };
        family
            .get_or_create(&self.labels)
            .set(saturating_i64(behind));
    }

    /// `n` more records of the source did not parse, or it refused them.
    pub(crate) fn parse_errors(&self, n: u64) {
        if n > 0 {
            self.parse_errors.inc_by(n);
            self.status.parse_errors(&self.labels.source, n);
        }
    }

    /// Whether the source's memory and own metrics are due to be sampled again
    /// ([`SAMPLE_EVERY`]); if so, they count as sampled now.
    pub(crate) fn sample_due(&self) -> bool {
        let mut at = self.sampled_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = at.is_none_or(|at| at.elapsed() >= SAMPLE_EVERY);
        if due {
            *at = Some(Instant::now());
        }
        due
    }

    /// What the source holds in memory, and its own metrics
    /// ([`sluice_source_sdk::Source::memory`], [`sluice_source_sdk::Source::metrics`]).
    pub(crate) fn sampled(&self, memory: u64, metrics: &[sluice_source_sdk::Metric]) {
        self.memory.set(saturating_i64(memory));
        record_custom(&self.custom, &self.custom_total, metrics, |name, labels| {
            CustomLabels {
                source: self.labels.clone(),
                name,
                labels,
            }
        });
        self.status.sampled(&self.labels.source, memory, metrics);
    }

    /// What the source's input system keeps for it ([`sluice_source_sdk::Source::retained`]).
    pub(crate) fn retained(&self, bytes: u64) {
        self.status.retained(&self.labels.source, bytes);
        self.retained
            .get_or_create(&self.labels)
            .set(saturating_i64(bytes));
    }
}

/// A part's own metrics into its two families (gauges, counters), each series labelled
/// by `of(name, labels)`: one scheme for sources and endpoints.
fn record_custom<L>(
    gauges: &Family<L, Gauge>,
    counters: &Family<L, Counter>,
    metrics: &[sluice_source_sdk::Metric],
    of: impl Fn(String, Vec<(String, String)>) -> L,
) where
    L: Clone + std::hash::Hash + Eq,
{
    for metric in metrics {
        let of = of(
            metric.name.to_string(),
            (metric.labels.iter())
                .map(|(key, value)| (key.to_string(), value.clone()))
                .collect(),
        );
        match metric.kind {
            MetricKind::Gauge => {
                gauges.get_or_create(&of).set(saturating_i64(metric.value));
            }
            // Sampled, not incremented: the part counts.
            MetricKind::Counter => {
                (counters.get_or_create(&of).inner())
                    .store(metric.value, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// A gauge holds an `i64`.
fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let metrics = Metrics::new();
        let shard = Shard {
            open: Default::default(),
            bindings: Vec::new(),
        };
        let handles = metrics.shard(&shard, ["views"]);
        handles.sources[0].lag(Lag::Bytes(5));
        handles.sources[0].lag(Lag::Messages(u64::MAX));
        handles.sources[0].retained(16 << 20);
        handles.sources[0].parse_errors(3);
        let custom = [
            sluice_source_sdk::Metric::gauge("kafka_partition_lag_messages", "lag", 7)
                .label("partition", 2),
            sluice_source_sdk::Metric::counter("reconnects", "reconnects", 4),
        ];
        handles.sources[0].sampled(4096, &custom);
        handles.reported(&EndpointReport {
            memory: 2048,
            metrics: vec![
                sluice_source_sdk::Metric::counter("epochs_committed", "epochs", 3),
                sluice_source_sdk::Metric::gauge("staged_bytes", "staged", 9).label("table", "t"),
            ],
            health: None,
        });
        handles
            .status
            .failed("driver", "reset".into(), true, Part::Endpoint);
        let text = metrics.render();
        for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = family.split_once(' ').unwrap();
            assert!(name.starts_with("sluice_"), "{name}");
            match kind {
                "counter" => assert!(name.ends_with("_total"), "{name}"),
                "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
                // Health is a state (0, 1, 2); a source's own gauges carry their unit
                // in their name label.
                "gauge" => assert!(
                    name.ends_with("_bytes")
                        || name.ends_with("_messages")
                        || name.ends_with("_health")
                        || name == "sluice_source_custom"
                        || name == "sluice_endpoint_custom",
                    "{name}"
                ),
                other => panic!("{name}: unexpected type {other}"),
            }
        }
        assert!(
            text.contains(
                r#"sluice_source_lag_bytes{materialization="",shard="00000000-00000000",source="views"} 5"#
            ),
            "{text}"
        );
        assert!(text.contains(&format!(
            r#"sluice_source_lag_messages{{materialization="",shard="00000000-00000000",source="views"}} {}"#,
            i64::MAX
        )));
        assert!(
            text.contains(
                r#"sluice_source_retained_bytes{materialization="",shard="00000000-00000000",source="views"} 16777216"#
            ),
            "{text}"
        );
        const OF: &str = r#"materialization="",shard="00000000-00000000""#;
        for line in [
            format!(r#"sluice_source_parse_errors_total{{{OF},source="views"}} 3"#),
            format!(r#"sluice_source_memory_bytes{{{OF},source="views"}} 4096"#),
            format!(
                r#"sluice_source_custom{{{OF},source="views",name="kafka_partition_lag_messages",partition="2"}} 7"#
            ),
            format!(
                r#"sluice_source_custom_counter_total{{{OF},source="views",name="reconnects"}} 4"#
            ),
            format!(r#"sluice_source_health{{{OF},source="views"}} 0"#),
            format!(r#"sluice_endpoint_health{{{OF}}} 1"#),
            format!(r#"sluice_endpoint_memory_bytes{{{OF}}} 2048"#),
            format!(r#"sluice_endpoint_custom_counter_total{{{OF},name="epochs_committed"}} 3"#),
            format!(r#"sluice_endpoint_custom{{{OF},name="staged_bytes",table="t"}} 9"#),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}
