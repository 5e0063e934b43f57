//! One member of a cluster: `sluice run` of a pipeline file with a `cluster:` section.
//!
//! ```text
//!  join:  standby listeners (standby.rs) ── lease (TTL) ── P/members/<me> with it
//!         (publishing their addresses) ── first shards of each materialization
//!         (once, by CAS on P/init/<mat>) ── first Apply (under P/lock/apply/<mat>)
//!         ── the deployment id, when an epoch sink needs it (once, by CAS on
//!         P/deployment)
//!  at each wake-up (wake.rs: a change to the watched keys, a loop that returned, a
//!  backoff or publishing that is due, or at most SAFETY_NET after the last):
//!    finished loops ──▶ hand over (Release), halve (Split), forget (Drop); the
//!      other shards of a loop that stopped for one of them wait to start again
//!    view (members, shards, assignments; loads under `balance: load`)
//!      ──balance::plan_with_moves──▶ Claim | Drop | Release | Split | Place (a move
//!      by load: the shard's placement and both members' cooldowns, leased)
//!    Claim: CAS the assignment with the lease; its revision is the fencing token;
//!           the shard waits for a loop
//!    waiting shards ──▶ loops (loops.rs): those one reader can resume together
//!      share one loop, one read of their sources; each shard's loop runs over its
//!      etcd log (log.rs) and Opens the store, which fences the previous holder there
//!    publish each held shard's last transaction and lag (P/status, with the lease)
//!  a shard's loop that fails (after its own retries): log why, release it and decline
//!  it (P/declined/<shard>/<me>, with the lease) for a backoff, 5 s doubling to 5 min;
//!  the other members' plans pass it to the next owner, this member's other shards run
//!  on; the marker is deleted when the backoff ends.
//!  keep-alive task: renews the lease every TTL/3; a lease that etcd says expired
//!  (the member was stopped or cut off longer than the TTL) ends the member with an
//!  error: its shards have been, or will be, taken over, and its writes are fenced.
//!  While etcd cannot be reached the member keeps asking: etcd keeps leases across its
//!  restarts, and a cut-off member commits nothing (each commit writes the shard's log
//!  in etcd, conditioned on its claim).
//!  shutdown (SIGINT/SIGTERM): each loop finishes its transaction, assignments are
//!  deleted and the lease revoked, so the others take over at once.
//! ```
//!
//! Every loop is the runtime's one transaction loop ([`Launcher::launch`]); the member
//! only decides which shards run here, and which of them share a loop. `join.rs`: what
//! it does once as it joins (first shards, deployment id, first Apply); `loops.rs`: the
//! loops of the held shards; `moves.rs`: a shard handed over, moved by load, split
//! (asked or automatic).

mod join;
pub(crate) use join::{decode_applied, try_lock};
mod loops;
mod moves;

use crate::assign::read_view;
use crate::assign::{self, Action, Held, View};
use crate::autosplit;
use crate::balance::{plan_with_moves, read_load};
use crate::etcd::{Cond, Etcd, EtcdError, Op};
use crate::keys::{Keys, MemberLoad, ShardId, ShardStatus};
use crate::load::CpuMeter;
use crate::standby::{Listens, MemberValue, Standbys, read_listens};
use crate::wake::{self, Wake};
use sluice_runtime::config::{AutoSplit, Balance, ClusterDef, Pipeline};
use sluice_runtime::metrics::Metrics;
use sluice_runtime::pipeline::{self, Launcher, Planned, RunOptions};
use sluice_runtime::txn::{Progress, RunError, Summary};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster: {0}")]
    Etcd(#[from] EtcdError),
    #[error("{place}: {reason}")]
    Invalid { place: String, reason: String },
    #[error(transparent)]
    Pipeline(#[from] pipeline::PipelineError),
    #[error(
        "member {member} lost its lease ({why}): its shards were fenced and are taken over \
         by the other members; exiting"
    )]
    LeaseLost { member: String, why: String },
}

pub(crate) fn invalid(place: impl Into<String>, reason: impl Into<String>) -> ClusterError {
    ClusterError::Invalid {
        place: place.into(),
        reason: reason.into(),
    }
}

/// What `sluice run` of a cluster member needs: the pipeline with its `cluster:`.
pub fn cluster_of(pipeline: &Pipeline) -> &ClusterDef {
    pipeline
        .cluster
        .as_ref()
        .expect("a member runs a pipeline with a cluster section")
}

/// The client of the pipeline's etcd and its key layout.
pub fn connect(cluster: &ClusterDef) -> Result<(Etcd, Keys), ClusterError> {
    let tls = match &cluster.tls {
        None => None,
        Some(tls) => Some(
            (tls.connector("cluster.tls")).map_err(|e| EtcdError::new("connect", e.to_string()))?,
        ),
    };
    let etcd = Etcd::connect(&cluster.etcd, Duration::from_secs(5), tls.as_ref())?;
    let prefix = cluster.prefix.as_deref().expect("parsing sets the prefix");
    Ok((etcd, Keys::new(prefix)))
}

/// Runs this member until `shutdown`, or until it fails or loses its lease. Returns
/// what each shard it ran committed.
pub async fn run(
    pipeline: &Pipeline,
    planned: Planned,
    opts: RunOptions,
    progress: Arc<Progress>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Vec<(String, Summary)>, ClusterError> {
    let cluster = cluster_of(pipeline);
    let (etcd, keys) = connect(cluster)?;
    let me = cluster.member.clone();
    let standbys = Standbys::start(pipeline);
    let lease = etcd.grant(cluster.lease_ttl).await?;
    let member_value = MemberValue {
        pid: std::process::id(),
        listens: standbys.addresses(),
    };
    let member_value = serde_json::to_string(&member_value).expect("serializes");
    let joined = etcd
        .txn(
            vec![Cond::Absent(keys.member(&me))],
            vec![Op::Put {
                key: keys.member(&me),
                value: member_value.into_bytes(),
                lease,
            }],
            vec![],
        )
        .await?;
    if !joined.succeeded {
        let _ = etcd.revoke(lease).await;
        return Err(invalid(
            "cluster.member",
            format!(
                "member id {me:?} is in use by a live member (a process stopped less than \
                 cluster.lease_ttl ago holds it until its lease expires): give each \
                 member its own id"
            ),
        ));
    }
    tracing::info!(member = %me, lease, "joined the cluster at {}", cluster.etcd.join(","));
    let (lost_tx, lost) = watch::channel(None::<String>);
    let keepalive = tokio::spawn(keep_alive(etcd.clone(), lease, cluster.lease_ttl, lost_tx));
    let watched = vec![
        keys.members(),
        keys.shards(),
        keys.assignments(),
        keys.declines(),
        keys.placements(),
        keys.cooldowns(),
    ];
    let member = Member {
        wake: Wake::watching(etcd.clone(), watched, wake::SAFETY_NET),
        etcd: etcd.clone(),
        keys,
        me: me.clone(),
        lease,
        standbys,
        lost,
        held: BTreeMap::new(),
        loops: BTreeMap::new(),
        next_loop: 0,
        waiting: BTreeSet::new(),
        failing: BTreeMap::new(),
        summaries: BTreeMap::new(),
        metrics: opts.metrics.clone().unwrap_or_default(),
        cpu: CpuMeter::default(),
        balance: cluster.balance,
        balance_interval: cluster.balance_interval,
        autosplit: cluster.autosplit.clone(),
        singletons: BTreeSet::new(),
    };
    let result = member
        .serve(pipeline, planned, opts, progress, &mut shutdown)
        .await;
    keepalive.abort();
    if !matches!(result, Err(ClusterError::LeaseLost { .. })) {
        // Leaving: the lease takes every key written with it (member, assignments,
        // statuses), so the others take over at once rather than after the TTL.
        if let Err(e) = etcd.revoke(lease).await {
            tracing::warn!("leaving the cluster: {e}; the lease expires by itself");
        }
    }
    result
}

/// Renews the lease; reports on `lost` once it has expired.
async fn keep_alive(etcd: Etcd, lease: i64, ttl: Duration, lost: watch::Sender<Option<String>>) {
    let mut renewed = Instant::now();
    loop {
        let pause = match etcd.keep_alive(lease).await {
            Ok(Some(_)) => {
                renewed = Instant::now();
                ttl / 3
            }
            Ok(None) => {
                lost.send_replace(Some(format!(
                    "etcd says it expired; it was last renewed {:.1}s ago",
                    renewed.elapsed().as_secs_f64()
                )));
                return;
            }
            Err(e) => {
                // etcd restarting, or this member cut off from it: only etcd can say
                // that the lease expired, and it keeps leases across a restart (it
                // renews each on recovery), so keep asking. Meanwhile this member's
                // loops commit nothing: each commit writes its shard's log in etcd,
                // conditioned on the claim, and the store fences a former holder.
                let silent = renewed.elapsed();
                match silent > ttl {
                    true => tracing::warn!(
                        "renewing the member's lease: {e}; not renewed for {:.1}s, longer \
                         than its TTL: etcd's answer, once it comes, says whether it \
                         expired",
                        silent.as_secs_f64()
                    ),
                    false => tracing::warn!("renewing the member's lease: {e}"),
                }
                Duration::from_millis(500)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// How often a member publishes its shards' lag (only what changed): at 1,000 shards at
/// most 200 etcd writes a second, for `sluice shards list`.
const PUBLISH_EVERY: Duration = Duration::from_secs(5);

/// Why a held shard's loop is stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    Release,
    Split,
    Drop,
}

struct Running {
    token: i64,
    stopping: Option<Stopping>,
    /// The loop it runs in (`loops.rs`); `None`: waiting for one, or never started (a
    /// shard claimed only to split it).
    in_loop: Option<u64>,
    /// It runs in a loop of its own: a loop it shared failed here.
    alone: bool,
    /// Its status as last published (published again only when it changes).
    published: Option<ShardStatus>,
    /// Since when its lag has stayed above `cluster.autosplit.lag_above`.
    lagging_since: Option<Instant>,
}

/// A shard whose loop failed here: how often in a row, and until when this member
/// declines it.
struct Failing {
    failures: u32,
    last: Instant,
    until: Instant,
    /// Its decline is published (`P/declined/<shard>/<me>`).
    marked: bool,
}

/// Failures further apart than this start the backoff over.
const FAILURES_FORGOTTEN: Duration = Duration::from_secs(600);

struct Member {
    /// What wakes the reconcile loop.
    wake: Wake,
    etcd: Etcd,
    keys: Keys,
    me: String,
    lease: i64,
    /// The listeners of the sources whose shards this member does not run.
    standbys: Standbys,
    /// Says why, once the lease has expired.
    lost: watch::Receiver<Option<String>>,
    held: BTreeMap<ShardId, Running>,
    /// The loops the held shards run in, by id.
    loops: BTreeMap<u64, loops::Loop>,
    next_loop: u64,
    /// Held shards waiting for a loop: started together at the end of the look.
    waiting: BTreeSet<ShardId>,
    failing: BTreeMap<ShardId, Failing>,
    summaries: BTreeMap<String, Summary>,
    metrics: Arc<Metrics>,
    /// This process's CPU use, published with the shards' status.
    cpu: CpuMeter,
    /// `cluster.balance` and `cluster.balance_interval`.
    balance: Balance,
    balance_interval: Duration,
    /// `cluster.autosplit`.
    autosplit: Option<AutoSplit>,
    /// The materializations that run as one shard, which never split.
    singletons: BTreeSet<String>,
}

impl Member {
    async fn serve(
        mut self,
        pipeline: &Pipeline,
        planned: Planned,
        mut opts: RunOptions,
        progress: Arc<Progress>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Vec<(String, Summary)>, ClusterError> {
        let cluster = cluster_of(pipeline);
        for m in &planned.materializations {
            let count = match assign::singleton(pipeline, &m.name) {
                Some(why) => {
                    tracing::info!(materialization = %m.name, "runs as one shard: {why}");
                    self.singletons.insert(m.name.clone());
                    1
                }
                None => cluster.shards,
            };
            self.first_shards(&m.name, count).await?;
        }
        self.first_apply(pipeline, &planned).await?;
        // A member serves until stopped: its shards' inputs may grow at any time.
        opts.follow = true;
        opts.metrics = Some(self.metrics.clone());
        let needed = (planned.materializations.iter()).any(|m| m.needs_deployment_id);
        let deployment = match needed {
            true => Some(self.deployment_id().await?),
            false => None,
        };
        let launcher = Launcher::with_deployment(pipeline, planned, opts, progress, deployment)?;
        let mut published = Instant::now();
        let mut lost = self.lost.clone();
        let outcome = loop {
            // The next backoff to end or publishing due, whichever is first (a decline
            // whose withdrawal failed is tried again at the next wake-up).
            let now = Instant::now();
            let due = (self.failing.values())
                .filter(|f| f.marked && f.until > now)
                .map(|f| f.until)
                .chain([published + PUBLISH_EVERY])
                .min()
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = shutdown.wait_for(|down| *down) => break Ok(()),
                why = lost.wait_for(Option::is_some) => {
                    let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                    break Err(ClusterError::LeaseLost { member: self.me.clone(), why });
                }
                _ = self.wake.next(due) => {}
            }
            self.reap().await;
            self.end_backoffs().await;
            match self.view().await {
                Ok((mut view, listens)) => {
                    self.standbys.follow(&self.me, &view, &listens);
                    // What this member backs off from, also if publishing it failed.
                    for (shard, failing) in &self.failing {
                        if let Some(state) = view.shards.get_mut(shard)
                            && failing.until > Instant::now()
                        {
                            state.declined.insert(self.me.clone());
                        }
                    }
                    let held = self
                        .held
                        .iter()
                        .map(|(id, r)| {
                            let h = Held {
                                token: r.token,
                                stopping: r.stopping.is_some(),
                            };
                            (id.clone(), h)
                        })
                        .collect();
                    for action in plan_with_moves(&self.me, &view, &held) {
                        if let Err(e) = self.act(action, &view).await {
                            tracing::warn!("{e}; retrying on the next view");
                        }
                    }
                    if let Err(e) = self.split_lagging().await {
                        tracing::warn!("splitting a shard that lags: {e}; retrying");
                    }
                    self.launch_waiting(&launcher).await;
                }
                Err(e) => tracing::warn!("reading the cluster's state: {e}; retrying"),
            }
            if published.elapsed() >= PUBLISH_EVERY {
                published = Instant::now();
                self.publish().await;
            }
        };
        // Every loop finishes its transaction in progress (a fenced one fails); the
        // caller then revokes the lease, which hands every shard over at once.
        self.stop_all().await;
        self.wake.stop().await;
        self.standbys.stop_all().await;
        outcome.map(|()| self.summaries.into_iter().collect())
    }

    /// `e`, or the loss of this member's lease when etcd refused a write with it
    /// because it has expired: a member stopped past its lease while it was joining
    /// learns it here, before its keep-alive task does.
    fn lease_lost(&self, e: EtcdError) -> ClusterError {
        match e.lease_gone {
            true => ClusterError::LeaseLost {
                member: self.me.clone(),
                why: format!("etcd refused a write with it: {e}"),
            },
            false => e.into(),
        }
    }

    /// The members, shards and assignments as etcd holds them now, and the addresses
    /// the members publish.
    async fn view(&self) -> Result<(View, BTreeMap<String, Listens>), EtcdError> {
        let (members, _) = self.etcd.get_prefix(&self.keys.members()).await?;
        let (shards, _) = self.etcd.get_prefix(&self.keys.shards()).await?;
        let (assignments, _) = self.etcd.get_prefix(&self.keys.assignments()).await?;
        let (declined, _) = self.etcd.get_prefix(&self.keys.declines()).await?;
        let mut view = read_view(&self.keys, &members, &shards, &assignments);
        view.balance = self.balance;
        if self.balance == Balance::Load {
            let (statuses, _) = self.etcd.get_prefix(&self.keys.statuses()).await?;
            let (placements, _) = self.etcd.get_prefix(&self.keys.placements()).await?;
            let (loads, _) = self.etcd.get_prefix(&self.keys.loads()).await?;
            let (cooldowns, _) = self.etcd.get_prefix(&self.keys.cooldowns()).await?;
            let keys = &self.keys;
            read_load(keys, &mut view, &statuses, &placements, &loads, &cooldowns);
        }
        for kv in &declined {
            let key = String::from_utf8_lossy(&kv.key);
            if let Some((materialization, range, member)) = self.keys.parse_declined(&key) {
                let id = ShardId {
                    materialization: materialization.to_string(),
                    range,
                };
                if let Some(state) = view.shards.get_mut(&id) {
                    state.declined.insert(member.to_string());
                }
            }
        }
        Ok((view, read_listens(&self.keys, &members)))
    }

    /// Carries out one action of the plan.
    async fn act(&mut self, action: Action, view: &View) -> Result<(), ClusterError> {
        match action {
            Action::Claim { shard, over } => {
                let key = self.keys.assignment(&shard);
                let when = match over {
                    None => Cond::Absent(key.clone()),
                    Some(revision) => Cond::ModRevision(key.clone(), revision),
                };
                let put = Op::Put {
                    key,
                    value: self.me.clone().into_bytes(),
                    lease: self.lease,
                };
                let claimed = self.etcd.txn(vec![when], vec![put], vec![]).await?;
                if !claimed.succeeded {
                    return Ok(()); // Someone else was quicker: the next view says who.
                }
                let token = claimed.revision;
                let splitting = view.shards.get(&shard).is_some_and(|s| s.splitting);
                if splitting {
                    tracing::info!(%shard, token, "claimed to split it");
                } else {
                    self.waiting.insert(shard.clone());
                }
                self.held.insert(
                    shard,
                    Running {
                        token,
                        stopping: splitting.then_some(Stopping::Split),
                        in_loop: None,
                        alone: false,
                        published: None,
                        lagging_since: None,
                    },
                );
            }
            Action::Abandon { shard, token } => self.hand_over(&shard, token).await,
            Action::Drop(shard) => self.stop(&shard, Stopping::Drop),
            Action::Release(shard) => self.stop(&shard, Stopping::Release),
            Action::Split(shard) => self.stop(&shard, Stopping::Split),
            Action::Place { shard, to } => self.place(&shard, &to).await?,
        }
        Ok(())
    }

    /// `shard`'s loop failed here with `why` (after its own retries): releases its
    /// assignment if still this member's, and declines the shard for a backoff that
    /// doubles with each failure in a row, so that another member runs it meanwhile.
    async fn decline(&mut self, shard: &ShardId, token: i64, why: &RunError) {
        let now = Instant::now();
        let failing = self.failing.entry(shard.clone()).or_insert(Failing {
            failures: 0,
            last: now,
            until: now,
            marked: false,
        });
        if now.duration_since(failing.last) > FAILURES_FORGOTTEN {
            failing.failures = 0;
        }
        failing.failures += 1;
        failing.last = now;
        let pause = assign::backoff(failing.failures);
        failing.until = now + pause;
        tracing::error!(
            %shard,
            failures = failing.failures,
            "{why}; releasing the shard and declining it for {}s: another member may run it,              this member's other shards run on",
            pause.as_secs()
        );
        let until_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(pause)
            .as_millis();
        let mark = Op::Put {
            key: self.keys.declined(shard, &self.me),
            value: until_ms.to_string().into_bytes(),
            lease: self.lease,
        };
        let assignment = self.keys.assignment(shard);
        // Released only while the claim is current; declined either way.
        let released = (self.etcd)
            .txn(
                vec![Cond::ModRevision(assignment.clone(), token)],
                vec![
                    Op::Delete(assignment),
                    Op::Delete(self.keys.status(shard)),
                    mark.clone(),
                ],
                vec![mark],
            )
            .await;
        match released {
            Ok(_) => failing.marked = true,
            Err(e) => tracing::warn!(
                %shard,
                "releasing and declining it: {e}; it moves once the lease expires, and this                  member does not claim it before its backoff ends"
            ),
        }
    }

    /// Withdraws the declines whose backoff has ended: the shard's owner may be this
    /// member again.
    async fn end_backoffs(&mut self) {
        let now = Instant::now();
        for (shard, failing) in &mut self.failing {
            if !failing.marked || failing.until > now {
                continue;
            }
            let key = self.keys.declined(shard, &self.me);
            match (self.etcd).txn(vec![], vec![Op::Delete(key)], vec![]).await {
                Ok(_) => {
                    failing.marked = false;
                    tracing::info!(%shard, "its backoff ended: this member may run it again");
                }
                Err(e) => tracing::debug!(%shard, "withdrawing its decline: {e}"),
            }
        }
        self.failing
            .retain(|_, f| f.marked || now.duration_since(f.last) <= FAILURES_FORGOTTEN);
    }

    /// Publishes each running shard's lag and rate, when they changed since last
    /// published.
    async fn publish(&mut self) {
        let snapshot = self.metrics.status.snapshot();
        for (shard, running) in &mut self.held {
            if running.stopping.is_some() {
                continue;
            }
            let label = shard.range.id();
            let Some(view) = (snapshot.shards.iter())
                .find(|s| s.materialization == shard.materialization && s.shard == label)
            else {
                continue;
            };
            let status = ShardStatus {
                lag: (view.sources.iter())
                    .filter_map(|(source, view)| Some((source, view.lag.as_ref()?)))
                    .map(|(source, lag)| (source.clone(), format!("{} {}", lag.behind, lag.unit)))
                    .collect(),
                rate: view.rate.round() as u64,
            };
            if let Some(rule) = &self.autosplit {
                let behind = (view.sources.values()).filter_map(|s| Some(s.lag.as_ref()?.behind));
                let since = running.lagging_since;
                running.lagging_since = autosplit::track(rule, behind.max(), since, Instant::now());
            }
            if running.published.as_ref() == Some(&status) {
                continue;
            }
            let value = serde_json::to_vec(&status).expect("serializes");
            // Only while the claim is current: a stale holder never overwrites.
            let put = (self.etcd).txn(
                vec![Cond::ModRevision(
                    self.keys.assignment(shard),
                    running.token,
                )],
                vec![Op::Put {
                    key: self.keys.status(shard),
                    value,
                    lease: self.lease,
                }],
                vec![],
            );
            match put.await {
                Ok(_) => running.published = Some(status),
                Err(e) => tracing::debug!(%shard, "publishing its status: {e}"),
            }
        }
        if let Some(cpu) = self.cpu.cores() {
            let value = serde_json::to_vec(&MemberLoad { cpu }).expect("serializes");
            let key = self.keys.load(&self.me);
            if let Err(e) = self.etcd.put(&key, value, self.lease).await {
                tracing::debug!("publishing the member's load: {e}");
            }
        }
    }

    /// Adds what the loop `label` (`loops::Loop::label`) committed to what the member
    /// reports as it leaves.
    fn add(&mut self, label: &str, s: &Summary) {
        (self.summaries.entry(label.to_string()).or_default()).merge(s);
    }
}
