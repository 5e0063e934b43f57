//! Who should run which shard, and what one member does about it (pure).
//!
//! Each shard's owner is chosen by rendezvous hashing over the live members: the member
//! whose `hash(member, shard)` is highest. Every member computes the same answer from
//! the same view, so nobody negotiates, and a member joining or leaving moves only the
//! shards it wins or held (about 1/n of them). A member then reconciles what it holds
//! with what it should hold:
//!
//! ```text
//!  held, assignment no longer ours (lease expired, taken over)   → Drop    (stop now)
//!  held, shard asked to split                                     → Split   (finish, stop, halve)
//!  held, another live member should own it                        → Release (finish, stop, hand over)
//!  unassigned, ours                                               → Claim   (CAS, then run)
//!  assigned to this member but not held (a hand-over that failed):
//!    ours                                                         → Claim over it
//!    another's                                                    → Abandon (delete it)
//! ```
//!
//! A member whose loop of a shard fails (a store it cannot reach, after the loop's own
//! retries) releases the shard and **declines** it for a while ([`backoff`]: 5 s,
//! doubling to 5 min): it publishes `P/declined/<shard>/<member>` with its lease and
//! deletes it when the backoff ends. A shard's owner is chosen among the live members
//! not declining it ([`owner_of`]), so another member tries it meanwhile, while the
//! failing member keeps its other shards; a shard every member declines waits for the
//! first backoff to end.
//!
//! Assignments are written with a compare-and-swap, so two members that briefly
//! disagree (one saw a member join, the other not yet) can never both hold a shard:
//! one claim fails, and the next view settles it.

use crate::etcd::KeyValue;
use crate::keys::{Keys, ShardId, ShardSpec};
use sluice_runtime::config::{Balance, Pipeline};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What a member saw of the cluster at one revision.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub members: BTreeSet<String>,
    /// Each live member's lease, the one its key `P/members/<member>` was written with.
    pub leases: BTreeMap<String, i64>,
    pub shards: BTreeMap<ShardId, ShardState>,
    /// How the pipeline weighs shards (`cluster.balance`, the same for every member).
    pub balance: Balance,
    /// Each member's published CPU use, in cores (`P/load/<member>`), under `load`.
    pub cpu: BTreeMap<String, f64>,
    /// The members that took part in a move by load less than
    /// `cluster.balance_interval` ago (`P/cooldown/<member>`), under `load`.
    pub cooling: BTreeSet<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardState {
    pub splitting: bool,
    /// The member holding it and its fencing token (the assignment's mod revision).
    pub holder: Option<(String, i64)>,
    /// The members backing off from it after their loop of it failed.
    pub declined: BTreeSet<String>,
    /// The member a move by load placed it on (`P/place/<shard>`, on that member's
    /// lease: it ends when the member leaves), under `load`.
    pub placed: Option<String>,
    /// Documents per second its holder last published it committed (`P/status`).
    pub rate: u64,
}

/// A shard this member holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub token: i64,
    /// Already finishing its transaction to release or split it.
    pub stopping: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Take the shard: create its assignment if absent, or replace the one this member
    /// left behind (`over`: its revision).
    Claim { shard: ShardId, over: Option<i64> },
    /// Delete the assignment this member left behind (revision `token`) of a shard that
    /// another member owns, so that the owner can claim it.
    Abandon { shard: ShardId, token: i64 },
    /// The shard is no longer ours: stop at once and write nothing more (a new holder
    /// has fenced us, or will).
    Drop(ShardId),
    /// Finish the transaction in progress, stop, then hand the shard over.
    Release(ShardId),
    /// Finish the transaction in progress, stop, then replace the shard by its halves.
    Split(ShardId),
    /// Move the shard to member `to` by load (the plan of `balance.rs`): write its
    /// placement and both members' cooldowns; the next look releases it to `to`.
    Place { shard: ShardId, to: String },
}

/// Why materialization `name` runs as one shard in a cluster, never split, if it does:
/// a source of it that one shard only may read (a replication slot), or an endpoint
/// that takes one writer at a time (an Iceberg committer). That shard moves between
/// members as any does, one holder at a time.
pub fn singleton(pipeline: &Pipeline, name: &str) -> Option<String> {
    let source = pipeline.sources_of(name).find_map(|(source, s)| {
        let why = s.singleton?;
        Some(format!(
            "source {source} (a {} source): {why}",
            s.config.kind()
        ))
    });
    source.or_else(|| {
        let m = pipeline.materializations.get(name)?;
        let why = m.singleton?;
        Some(format!(
            "its endpoint (a {} driver): {why}",
            m.endpoint.kind
        ))
    })
}

/// The live member that should run `shard`, `None` with no members.
pub fn owner<'m>(members: &'m BTreeSet<String>, shard: &ShardId) -> Option<&'m str> {
    members
        .iter()
        .max_by_key(|member| {
            let text = format!("{member}\0{shard}");
            (sluice_doc::hash::key_hash(text.as_bytes()), member.as_str())
        })
        .map(String::as_str)
}

/// The live member that should run `shard`: the member a move by load placed it on, if
/// it is live and does not decline it, else the rendezvous owner among the members not
/// declining it; `None` when every member declines it (or none is live).
pub fn owner_of<'v>(view: &'v View, shard: &ShardId) -> Option<&'v str> {
    let Some(state) = view.shards.get(shard) else {
        return owner(&view.members, shard);
    };
    if view.balance == Balance::Load
        && let Some(placed) = &state.placed
        && let Some(member) = view.members.get(placed)
        && !state.declined.contains(placed)
    {
        return Some(member.as_str());
    }
    let willing: BTreeSet<String> = (view.members.iter())
        .filter(|m| !state.declined.contains(*m))
        .cloned()
        .collect();
    let chosen = owner(&willing, shard)?;
    view.members.get(chosen).map(String::as_str)
}

/// The first pause of a member after its loop of a shard failed; it doubles with each
/// failure in a row, up to [`MAX_BACKOFF`]. Short enough that a passing fault (a store
/// restarting) costs a few seconds; long enough that a member that cannot reach a store
/// does not take the shard back from the member running it at every tick.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest pause: a member whose store came back runs its share again within it.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long a member declines a shard after its `failures`-th failure in a row (1: the
/// first).
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// What member `me` does next, given the view and what it holds.
pub fn plan(me: &str, view: &View, held: &BTreeMap<ShardId, Held>) -> Vec<Action> {
    let mut actions = Vec::new();
    for (shard, h) in held {
        let Some(state) = view.shards.get(shard) else {
            actions.push(Action::Drop(shard.clone()));
            continue;
        };
        let ours = state
            .holder
            .as_ref()
            .is_some_and(|(member, token)| member == me && *token == h.token);
        if !ours {
            actions.push(Action::Drop(shard.clone()));
        } else if h.stopping {
        } else if state.splitting {
            actions.push(Action::Split(shard.clone()));
        } else if owner_of(view, shard).is_some_and(|owner| owner != me) {
            actions.push(Action::Release(shard.clone()));
        }
    }
    for (shard, state) in &view.shards {
        if held.contains_key(shard) {
            continue;
        }
        let ours = owner_of(view, shard) == Some(me);
        let shard = shard.clone();
        match &state.holder {
            None if ours => actions.push(Action::Claim { shard, over: None }),
            Some((member, token)) if member == me => actions.push(match ours {
                true => Action::Claim {
                    shard,
                    over: Some(*token),
                },
                false => Action::Abandon {
                    shard,
                    token: *token,
                },
            }),
            _ => {}
        }
    }
    actions
}

impl Action {
    /// The shard it acts on.
    pub fn shard(&self) -> &ShardId {
        match self {
            Action::Claim { shard, .. }
            | Action::Abandon { shard, .. }
            | Action::Place { shard, .. } => shard,
            Action::Drop(shard) | Action::Release(shard) | Action::Split(shard) => shard,
        }
    }
}

/// The view in the keys read (pure).
pub fn read_view(
    keys: &Keys,
    members: &[KeyValue],
    shards: &[KeyValue],
    assignments: &[KeyValue],
) -> View {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut view = View::default();
    let members_dir = keys.members();
    for kv in members {
        if let Some(member) = text(&kv.key).strip_prefix(&members_dir) {
            view.members.insert(member.to_string());
            view.leases.insert(member.to_string(), kv.lease);
        }
    }
    let shards_dir = keys.shards();
    for kv in shards {
        let key = text(&kv.key);
        let Some((materialization, range)) = keys.parse_shard(&shards_dir, &key) else {
            continue;
        };
        let spec: ShardSpec = serde_json::from_slice(&kv.value).unwrap_or_default();
        let id = ShardId {
            materialization: materialization.to_string(),
            range,
        };
        view.shards.insert(
            id,
            ShardState {
                splitting: spec.splitting,
                ..ShardState::default()
            },
        );
    }
    let assignments_dir = keys.assignments();
    for kv in assignments {
        let key = text(&kv.key);
        let Some((materialization, range)) = keys.parse_shard(&assignments_dir, &key) else {
            continue;
        };
        let id = ShardId {
            materialization: materialization.to_string(),
            range,
        };
        if let Some(state) = view.shards.get_mut(&id) {
            state.holder = Some((text(&kv.value), kv.mod_revision));
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ShardDef;

    fn shard(n: u32, of: u32) -> ShardId {
        ShardId {
            materialization: "views".into(),
            range: ShardDef::split_evenly(of)[n as usize],
        }
    }

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// A shard, its holder and token, and whether it is splitting.
    type Row<'a> = (ShardId, Option<(&'a str, i64)>, bool);

    fn view(names: &[&str], shards: &[Row<'_>]) -> View {
        View {
            members: members(names),
            shards: shards
                .iter()
                .map(|(id, holder, splitting)| {
                    let state = ShardState {
                        splitting: *splitting,
                        holder: holder.map(|(m, t)| (m.to_string(), t)),
                        ..ShardState::default()
                    };
                    (id.clone(), state)
                })
                .collect(),
            ..View::default()
        }
    }

    #[test]
    fn owners_spread_shards_and_a_leaving_member_moves_only_its_own() {
        let three = members(&["a", "b", "c"]);
        let shards: Vec<_> = (0..64).map(|i| shard(i, 64)).collect();
        let before: Vec<_> = shards.iter().map(|s| owner(&three, s).unwrap()).collect();
        for m in ["a", "b", "c"] {
            let n = before.iter().filter(|o| **o == m).count();
            assert!((8..=36).contains(&n), "{m} owns {n} of 64");
        }
        let two = members(&["a", "b"]);
        for (s, was) in shards.iter().zip(&before) {
            let now = owner(&two, s).unwrap();
            if *was != "c" {
                assert_eq!(now, *was, "{s} moved although its owner stayed");
            }
        }
        assert_eq!(owner(&BTreeSet::new(), &shards[0]), None);
    }

    #[test]
    fn a_member_claims_what_it_should_own_and_nothing_held_elsewhere() {
        let all = [shard(0, 4), shard(1, 4), shard(2, 4), shard(3, 4)];
        let names = ["a", "b"];
        let m = members(&names);
        let mut shards = Vec::new();
        for s in &all {
            // One of "a"'s shards is held by "b" for now (it will release it).
            let holder = (s == &all[0]).then_some(("b", 7));
            shards.push((s.clone(), holder, false));
        }
        let v = view(&names, &shards);
        let actions = plan("a", &v, &BTreeMap::new());
        for s in &all {
            let claimed = actions.contains(&Action::Claim {
                shard: s.clone(),
                over: None,
            });
            let should = owner(&m, s) == Some("a") && s != &all[0];
            assert_eq!(claimed, should, "{s}");
        }
    }

    #[test]
    fn a_holder_releases_drops_and_splits() {
        let s = shard(0, 1);
        let held = |token, stopping| BTreeMap::from([(s.clone(), Held { token, stopping })]);
        let ours = Some(("a", 5));
        // Alone: keeps it.
        assert_eq!(
            plan(
                "a",
                &view(&["a"], &[(s.clone(), ours, false)]),
                &held(5, false)
            ),
            vec![]
        );
        // Its token is stale (a new holder, or a new claim): drop at once.
        let v = view(&["a", "b"], &[(s.clone(), Some(("b", 9)), false)]);
        assert_eq!(
            plan("a", &v, &held(5, false)),
            vec![Action::Drop(s.clone())]
        );
        let v = view(&["a"], &[(s.clone(), None, false)]);
        assert_eq!(
            plan("a", &v, &held(5, false)),
            vec![Action::Drop(s.clone())]
        );
        // Asked to split.
        let v = view(&["a"], &[(s.clone(), ours, true)]);
        assert_eq!(
            plan("a", &v, &held(5, false)),
            vec![Action::Split(s.clone())]
        );
        // Already stopping: nothing new.
        assert_eq!(plan("a", &v, &held(5, true)), vec![]);
        // Another member should own it: release (whichever it is).
        let names = ["a", "b", "c", "d", "e"];
        let all = members(&names);
        let other = owner(&all, &s).unwrap();
        let holder = names.iter().find(|n| **n != other).unwrap();
        let v = view(&names, &[(s.clone(), Some((holder, 5)), false)]);
        assert_eq!(
            plan(holder, &v, &held(5, false)),
            vec![Action::Release(s.clone())]
        );
        // A hand-over that failed left the assignment: the owner claims over it, any
        // other member deletes it.
        let v = view(&names, &[(s.clone(), Some((other, 3)), false)]);
        assert_eq!(
            plan(other, &v, &BTreeMap::new()),
            vec![Action::Claim {
                shard: s.clone(),
                over: Some(3)
            }]
        );
        let v = view(&names, &[(s.clone(), Some((holder, 3)), false)]);
        assert_eq!(
            plan(holder, &v, &BTreeMap::new()),
            vec![Action::Abandon {
                shard: s.clone(),
                token: 3
            }]
        );
    }

    #[test]
    fn a_shard_its_owner_declines_goes_to_the_next_member_and_back_once_it_stops() {
        let names = ["a", "b", "c"];
        let s = shard(0, 1);
        let all = members(&names);
        let first = owner(&all, &s).unwrap();
        let held = |token| {
            BTreeMap::from([(
                s.clone(),
                Held {
                    token,
                    stopping: false,
                },
            )])
        };
        let declining = |who: &[&str], holder: Option<(&str, i64)>| {
            let mut v = view(&names, &[(s.clone(), holder, false)]);
            let state = v.shards.get_mut(&s).unwrap();
            state.declined = who.iter().map(|m| m.to_string()).collect();
            v
        };
        // The owner declines it (its loop failed; it released the shard): the owner
        // among the others claims it, and the decliner does not.
        let v = declining(&[first], None);
        let second = owner_of(&v, &s).unwrap();
        assert_ne!(second, first);
        assert_eq!(
            plan(second, &v, &BTreeMap::new()),
            vec![Action::Claim {
                shard: s.clone(),
                over: None
            }]
        );
        assert_eq!(plan(first, &v, &BTreeMap::new()), vec![]);
        // Held by the second member while the first declines: kept.
        let v = declining(&[first], Some((second, 8)));
        assert_eq!(plan(second, &v, &held(8)), vec![]);
        // The first member's backoff ended: the shard goes back to its owner.
        let v = declining(&[], Some((second, 8)));
        assert_eq!(plan(second, &v, &held(8)), vec![Action::Release(s.clone())]);
        // Every member declines it: nobody claims it until a backoff ends.
        let v = declining(&names, None);
        assert_eq!(owner_of(&v, &s), None);
        for m in names {
            assert_eq!(plan(m, &v, &BTreeMap::new()), vec![], "{m}");
        }
        // A decliner that left the assignment behind deletes it.
        let v = declining(&[first], Some((first, 3)));
        assert_eq!(
            plan(first, &v, &BTreeMap::new()),
            vec![Action::Abandon {
                shard: s.clone(),
                token: 3
            }]
        );
    }

    #[test]
    fn a_failing_shard_backs_off_from_5_seconds_doubling_to_5_minutes() {
        let table = [
            (1, 5),
            (2, 10),
            (3, 20),
            (4, 40),
            (5, 80),
            (6, 160),
            (7, 300),
            (8, 300),
            (1000, 300),
        ];
        for (failures, seconds) in table {
            assert_eq!(
                backoff(failures),
                Duration::from_secs(seconds),
                "{failures}"
            );
        }
    }
}
