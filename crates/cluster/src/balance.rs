//! Shards weighed by load (pure): which one shard, if any, moves from the busiest member
//! to the least busy, so that two hot shards do not share a member while another member
//! could take one of them.
//!
//! Rendezvous hashing ([`crate::assign::owner`]) spreads shards by count. Under
//! `cluster.balance: load` (the default) every member also computes, from the same view,
//! the same one move or none:
//!
//! ```text
//!  a shard weighs the documents per second its holder last published it committed
//!  (P/status: over the runtime's rate window); a member's load is its shards' sum
//!  only once the cluster is settled: every shard held by its owner, none splitting
//!  among the members not cooling down (P/cooldown/<member>, a lease of
//!  cluster.balance_interval: a member takes part in one move per interval):
//!    hot  = the busiest (ties: the first by name), cool = the least busy
//!    move only if  load(hot) > RATIO × load(cool) + FLOOR
//!              and cool's published CPU is not above hot's
//!    the shard s of hot, not declined by cool, with weight(s) < load(hot) − load(cool)
//!    (the move lowers the pair's larger load), leaving the smallest larger load
//!    (ties: the first shard)
//! ```
//!
//! The holder of that shard carries the move out ([`Action::Place`], added to its plan
//! by [`plan_with_moves`]): in one etcd transaction, conditioned on its claim, on cool's
//! member key being the one it read, and on neither member cooling, it writes the
//! shard's placement (`P/place/<shard>` = cool) **with cool's own lease**, and both
//! members' cooldown keys with a fresh lease of the interval; from then on
//! [`crate::assign::owner_of`] names cool, so the holder releases the shard and cool
//! claims it.
//!
//! A placement lives as long as the member it names, and no longer:
//!
//! ```text
//!  cool leaves (SIGTERM, or SIGKILL and its lease expires)
//!      → etcd deletes P/members/cool and P/place/<shard> in one step: rendezvous again
//!  the shard splits      → the split's transaction deletes P/place/<shard>; the halves
//!                          are other keys, never placed by it
//!  cool declines it      → ignored while the decline lasts: rendezvous among the
//!                          members not declining it, so someone owns it
//!  a placement not on the lease of the member it names (one written before placements
//!  were leased)          → ignored ([`read_load`])
//! ```
//!
//! So no member's clock and no cleanup decide when a placement ends: each member reads
//! the same keys and leases. A shard with no published rate weighs nothing and stays
//! where rendezvous puts it.
//!
//! Why it does not oscillate: a move takes weight `w` from a member to one whose load is
//! lower by more than `w`, so the sum of the squared loads falls with each move; with
//! loads that stay put, moves end, and the same shard never goes straight back (that
//! would need the reverse gap). The ratio, the floor and the cooldown keep noise (a
//! rate that wobbles, a rate just republished after a move) from moving anything.
//!
//! Lag is shown, not weighed: sources count it in their own units (bytes of a file,
//! messages of a topic), and a shard far behind costs its member what it commits,
//! which its rate says. Deterministic: the decision reads only the view (published
//! rates and CPU, placements, cooldowns), never a member's clock.

use crate::assign::{Action, Held, View, owner_of, plan};
use crate::etcd::KeyValue;
use crate::keys::{Keys, MemberLoad, ShardId, ShardStatus};
use sluice_runtime::config::Balance;
use std::collections::BTreeMap;

/// How much busier than the least busy member the busiest must be before a shard moves.
pub const RATIO: f64 = 1.5;
/// Documents per second the busiest member must carry beyond [`RATIO`] times the least
/// busy's: below it nothing moves (an idle cluster, a trickle).
pub const FLOOR: f64 = 500.0;

/// One shard moved by load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub shard: ShardId,
    pub from: String,
    pub to: String,
}

/// The one move by load the view calls for, if any (see the module's header).
pub fn rebalance(view: &View) -> Option<Move> {
    if view.balance != Balance::Load {
        return None;
    }
    let mut load: BTreeMap<&str, f64> = (view.members.iter())
        .filter(|m| !view.cooling.contains(*m))
        .map(|m| (m.as_str(), 0.0))
        .collect();
    for (id, state) in &view.shards {
        let (holder, _) = state.holder.as_ref()?;
        if state.splitting || owner_of(view, id) != Some(holder.as_str()) {
            return None; // Not settled: a claim, a handover or a split is under way.
        }
        if let Some(sum) = load.get_mut(holder.as_str()) {
            *sum += state.rate as f64;
        }
    }
    let by_load = |a: &(&&str, &f64), b: &(&&str, &f64)| a.1.total_cmp(b.1).then(b.0.cmp(a.0));
    let (&hot, &hot_load) = load.iter().max_by(by_load)?;
    let (&cool, &cool_load) = load.iter().min_by(by_load)?;
    let cpu = |m: &str| view.cpu.get(m).copied();
    let cooler_cpu = match (cpu(hot), cpu(cool)) {
        (Some(hot), Some(cool)) => cool <= hot,
        _ => true,
    };
    if hot == cool || hot_load <= RATIO * cool_load + FLOOR || !cooler_cpu {
        return None;
    }
    let (shard, _) = (view.shards.iter())
        .filter(|(_, s)| s.holder.as_ref().is_some_and(|(m, _)| m == hot))
        .filter(|(_, s)| !s.declined.contains(cool))
        .map(|(id, s)| (id, s.rate as f64))
        .filter(|(_, w)| *w > 0.0 && *w < hot_load - cool_load)
        .map(|(id, w)| (id, (hot_load - w).max(cool_load + w)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)))?;
    Some(Move {
        shard: shard.clone(),
        from: hot.to_string(),
        to: cool.to_string(),
    })
}

/// [`plan`] with the move by load member `me` carries out now, if any: the view's one
/// move when `me` holds its shard and neither stops it nor acts on it otherwise.
pub fn plan_with_moves(me: &str, view: &View, held: &BTreeMap<ShardId, Held>) -> Vec<Action> {
    let mut actions = plan(me, view, held);
    if let Some(to) = rebalance(view)
        && to.from == me
        && held.get(&to.shard).is_some_and(|h| !h.stopping)
        && !actions.iter().any(|a| a.shard() == &to.shard)
    {
        actions.push(Action::Place {
            shard: to.shard,
            to: to.to,
        });
    }
    actions
}

/// Adds to `view` what weighing by load reads (pure): each shard's published rate and
/// placement (one on the lease of the member it names, see the module's header), each
/// member's CPU, and the members cooling down. `view` holds the members already
/// ([`crate::assign::read_view`]).
pub fn read_load(
    keys: &Keys,
    view: &mut View,
    statuses: &[KeyValue],
    placements: &[KeyValue],
    loads: &[KeyValue],
    cooldowns: &[KeyValue],
) {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let shard_of = |under: String, kv: &KeyValue| {
        let key = text(&kv.key);
        let (materialization, range) = keys.parse_shard(&under, &key)?;
        Some(ShardId {
            materialization: materialization.to_string(),
            range,
        })
    };
    for kv in statuses {
        if let Some(id) = shard_of(keys.statuses(), kv)
            && let Some(state) = view.shards.get_mut(&id)
        {
            let status: ShardStatus = serde_json::from_slice(&kv.value).unwrap_or_default();
            state.rate = status.rate;
        }
    }
    for kv in placements {
        let member = text(&kv.value);
        // Only on the lease of the member it names: it ends when that member leaves.
        let leased = view.leases.get(&member) == Some(&kv.lease);
        if leased
            && let Some(id) = shard_of(keys.placements(), kv)
            && let Some(state) = view.shards.get_mut(&id)
        {
            state.placed = Some(member);
        }
    }
    for kv in loads {
        if let Some(member) = text(&kv.key).strip_prefix(&keys.loads())
            && let Ok(load) = serde_json::from_slice::<MemberLoad>(&kv.value)
        {
            view.cpu.insert(member.to_string(), load.cpu);
        }
    }
    for kv in cooldowns {
        if let Some(member) = text(&kv.key).strip_prefix(&keys.cooldowns()) {
            view.cooling.insert(member.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign::{ShardState, owner};
    use crate::keys::ShardDef;
    use std::collections::BTreeSet;

    const MEMBERS: [&str; 3] = ["a", "b", "c"];

    fn shards(n: u32) -> Vec<ShardId> {
        (ShardDef::split_evenly(n).into_iter())
            .map(|range| ShardId {
                materialization: "views".into(),
                range,
            })
            .collect()
    }

    /// Three members, each shard held by its rendezvous owner at `rates[i]` docs/s.
    fn settled(all: &[ShardId], rates: &[u64]) -> View {
        let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
        let shards = (all.iter().zip(rates))
            .map(|(id, rate)| {
                let holder = owner(&members, id).unwrap().to_string();
                let state = ShardState {
                    holder: Some((holder, 1)),
                    rate: *rate,
                    ..ShardState::default()
                };
                (id.clone(), state)
            })
            .collect();
        View {
            members,
            shards,
            ..View::default()
        }
    }

    /// What the holder of a move does, then what the cluster looks like once the
    /// handover is done: the shard held by `to`, both members cooling down.
    fn carry_out(view: &mut View, m: &Move) {
        let holder = view.shards[&m.shard].holder.clone().unwrap().0;
        let held = held_by(view, &holder);
        let place = Action::Place {
            shard: m.shard.clone(),
            to: m.to.clone(),
        };
        assert!(
            plan_with_moves(&holder, view, &held).contains(&place),
            "{m:?}"
        );
        let state = view.shards.get_mut(&m.shard).unwrap();
        state.placed = Some(m.to.clone());
        // The holder now releases it (its owner is `to`).
        assert_eq!(
            plan_with_moves(&holder, view, &held),
            vec![Action::Release(m.shard.clone())]
        );
        let state = view.shards.get_mut(&m.shard).unwrap();
        state.holder = Some((m.to.clone(), 1));
        view.cooling.extend([m.from.clone(), m.to.clone()]);
    }

    /// What member `me` holds in a settled view.
    fn held_by(view: &View, me: &str) -> BTreeMap<ShardId, Held> {
        (view.shards.iter())
            .filter(|(_, s)| s.holder.as_ref().is_some_and(|(m, _)| m == me))
            .map(|(id, s)| {
                let token = s.holder.as_ref().unwrap().1;
                let h = Held {
                    token,
                    stopping: false,
                };
                (id.clone(), h)
            })
            .collect()
    }

    /// Two shards of one member (of three) made hot, the others cool.
    fn two_hot_on_one(all: &[ShardId]) -> (View, String, Vec<ShardId>) {
        let v = settled(all, &vec![0; all.len()]);
        let member = (MEMBERS.iter())
            .find(|m| {
                let held = v
                    .shards
                    .values()
                    .filter(|s| s.holder.as_ref().unwrap().0 == **m);
                held.count() >= 2
            })
            .unwrap()
            .to_string();
        let hot: Vec<ShardId> = (v.shards.iter())
            .filter(|(_, s)| s.holder.as_ref().unwrap().0 == member)
            .map(|(id, _)| id.clone())
            .take(2)
            .collect();
        let rates: Vec<u64> = (all.iter())
            .map(|id| if hot.contains(id) { 20_000 } else { 300 })
            .collect();
        (settled(all, &rates), member, hot)
    }

    #[test]
    fn two_hot_shards_on_one_member_of_three_move_apart() {
        let all = shards(6);
        let (mut v, member, hot) = two_hot_on_one(&all);
        let m = rebalance(&v).expect("a move");
        assert_eq!(m.from, member);
        assert!(hot.contains(&m.shard), "{m:?} moves a cool shard");
        carry_out(&mut v, &m);
        let holders: BTreeSet<&str> = (hot.iter())
            .map(|id| v.shards[id].holder.as_ref().unwrap().0.as_str())
            .collect();
        assert_eq!(holders.len(), 2, "the hot shards still share a member");
        // Once the cooldowns end, what else moves (cool shards off the hot members)
        // ends, and never brings the hot shards together again.
        for _ in 0..all.len() {
            v.cooling.clear();
            let Some(m) = rebalance(&v) else {
                break;
            };
            carry_out(&mut v, &m);
        }
        v.cooling.clear();
        assert_eq!(rebalance(&v), None);
        let holders: BTreeSet<&str> = (hot.iter())
            .map(|id| v.shards[id].holder.as_ref().unwrap().0.as_str())
            .collect();
        assert_eq!(holders.len(), 2, "the hot shards share a member again");
    }

    #[test]
    fn a_balanced_view_moves_nothing() {
        let all = shards(6);
        let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
        // Each member's shards commit 6,000 documents a second in all, or about that.
        let even: Vec<u64> = (all.iter())
            .map(|id| {
                let o = owner(&members, id);
                6000 / all
                    .iter()
                    .filter(|other| owner(&members, other) == o)
                    .count() as u64
            })
            .collect();
        let uneven: Vec<u64> = (even.iter().enumerate())
            .map(|(i, r)| if i % 2 == 0 { r + r / 5 } else { r - r / 5 })
            .collect();
        for rates in [vec![0; 6], vec![100, 0, 300, 0, 50, 200], even, uneven] {
            assert_eq!(rebalance(&settled(&all, &rates)), None, "{rates:?}");
        }
        // One hot shard alone on its member: moving it would only move the imbalance.
        let mut rates = [10; 6];
        let alone = (all.iter()).position(|id| {
            let o = owner(&members, id);
            all.iter()
                .filter(|other| owner(&members, other) == o)
                .count()
                == 1
        });
        if let Some(i) = alone {
            rates[i] = 50_000;
            assert_eq!(rebalance(&settled(&all, &rates)), None);
        }
    }

    #[test]
    fn nothing_moves_by_count_while_unsettled_or_cooling_or_onto_a_busier_cpu() {
        let all = shards(6);
        let (v, member, hot) = two_hot_on_one(&all);
        let m = rebalance(&v).unwrap();
        let mut count = v.clone();
        count.balance = Balance::Count;
        assert_eq!(rebalance(&count), None);
        let mut claiming = v.clone();
        claiming.shards.get_mut(&hot[0]).unwrap().holder = None;
        assert_eq!(rebalance(&claiming), None);
        let mut cooling = v.clone();
        cooling.cooling.insert(member.clone());
        assert_eq!(rebalance(&cooling), None);
        let mut busy = v.clone();
        busy.cpu = BTreeMap::from([(member.clone(), 0.5), (m.to.clone(), 0.9)]);
        assert_eq!(rebalance(&busy), None);
        // A placement on a member that left falls back to rendezvous.
        let mut gone = v.clone();
        gone.shards.get_mut(&hot[0]).unwrap().placed = Some("z".into());
        assert_eq!(owner_of(&gone, &hot[0]), Some(member.as_str()));
    }

    #[test]
    fn every_member_computes_the_same_plan_and_only_the_holder_moves_it() {
        let all = shards(6);
        let (v, member, _) = two_hot_on_one(&all);
        let m = rebalance(&v).unwrap();
        assert_eq!(rebalance(&v.clone()), Some(m.clone()));
        for me in MEMBERS {
            let held = held_by(&v, me);
            let places: Vec<Action> = (plan_with_moves(me, &v, &held).into_iter())
                .filter(|a| matches!(a, Action::Place { .. }))
                .collect();
            let expected = match me == member {
                true => vec![Action::Place {
                    shard: m.shard.clone(),
                    to: m.to.clone(),
                }],
                false => vec![],
            };
            assert_eq!(places, expected, "{me}");
        }
    }

    /// The lease of each of the three members in [`read`]'s keys.
    fn lease_of(member: &str) -> i64 {
        10 * (1 + MEMBERS.iter().position(|m| *m == member).unwrap() as i64)
    }

    /// The keys of the three members and of `all`, unassigned, as etcd answers them,
    /// with `placements` (shard, member named, lease written with).
    fn read(all: &[ShardId], placements: &[(&ShardId, &str, i64)]) -> View {
        let keys = Keys::new("/p");
        let kv = |key: String, value: &[u8], lease| KeyValue {
            key: key.into_bytes(),
            value: value.to_vec(),
            lease,
            ..KeyValue::default()
        };
        let members: Vec<KeyValue> = (MEMBERS.iter())
            .map(|m| kv(keys.member(m), b"{}", lease_of(m)))
            .collect();
        let shards: Vec<KeyValue> = (all.iter())
            .map(|id| kv(keys.shard(id), b"{}", 0))
            .collect();
        let placed: Vec<KeyValue> = (placements.iter())
            .map(|(id, m, lease)| kv(keys.placement(id), m.as_bytes(), *lease))
            .collect();
        let mut view = crate::assign::read_view(&keys, &members, &shards, &[]);
        view.balance = Balance::Load;
        read_load(&keys, &mut view, &[], &placed, &[], &[]);
        view
    }

    /// A member of the three other than the rendezvous owner of `id`.
    fn not_owner(id: &ShardId) -> &'static str {
        let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
        let owner = owner(&members, id).unwrap();
        MEMBERS.into_iter().find(|m| *m != owner).unwrap()
    }

    /// `member`'s plan over `view`, holding nothing, is to claim `shard`, unassigned.
    fn assert_claims_unheld(member: &str, view: &View, shard: ShardId) {
        let plan = plan_with_moves(member, view, &BTreeMap::new());
        assert_eq!(plan, vec![Action::Claim { shard, over: None }], "{member}");
    }

    #[test]
    fn a_placement_counts_only_on_the_lease_of_the_member_it_names() {
        let all = shards(4);
        let to: Vec<&str> = all.iter().map(not_owner).collect();
        let v = read(
            &all,
            &[
                (&all[0], to[0], lease_of(to[0])),
                (&all[1], to[1], 0), // written before placements were leased
                (&all[2], to[2], lease_of(to[2]) + 1), // another lease than its member's
                (&all[3], "gone", 40), // a member not in the view
            ],
        );
        assert_eq!(v.shards[&all[0]].placed.as_deref(), Some(to[0]));
        assert_eq!(owner_of(&v, &all[0]), Some(to[0]));
        for id in &all[1..] {
            assert_eq!(v.shards[id].placed, None, "{id}");
            assert_eq!(owner_of(&v, id), owner(&v.members, id), "{id}");
        }
    }

    #[test]
    fn a_shard_placed_on_a_member_that_leaves_is_claimed_by_its_rendezvous_owner() {
        let all = shards(1);
        let to = not_owner(&all[0]);
        let placed = read(&all, &[(&all[0], to, lease_of(to))]);
        assert_eq!(owner_of(&placed, &all[0]), Some(to));
        assert_claims_unheld(to, &placed, all[0].clone());
        // `to` left before it claimed: etcd deleted its member key and every key on its
        // lease, the placement with them.
        let mut left = read(&all, &[]);
        left.members.remove(to);
        left.leases.remove(to);
        let owner = owner(&left.members, &all[0]).unwrap().to_string();
        assert_eq!(owner_of(&left, &all[0]), Some(owner.as_str()));
        assert_claims_unheld(&owner, &left, all[0].clone());
    }

    #[test]
    fn the_halves_of_a_split_shard_inherit_no_placement() {
        let parent = ShardId {
            materialization: "views".into(),
            range: ShardDef::split_evenly(1)[0],
        };
        let (lo, hi) = parent.range.halves().unwrap();
        let halves: Vec<ShardId> = [lo, hi]
            .map(|range| ShardId {
                materialization: "views".into(),
                range,
            })
            .into();
        // Even a placement of the parent left behind names neither half.
        let to = not_owner(&halves[0]);
        let v = read(&halves, &[(&parent, to, lease_of(to))]);
        for half in &halves {
            assert_eq!(v.shards[half].placed, None, "{half}");
            assert_eq!(owner_of(&v, half), owner(&v.members, half), "{half}");
        }
    }

    #[test]
    fn a_placed_member_that_declines_the_shard_leaves_it_owned_by_another() {
        let all = shards(1);
        let to = not_owner(&all[0]);
        let mut v = read(&all, &[(&all[0], to, lease_of(to))]);
        // Its loop failed on `to`, which released the shard and declines it.
        v.shards
            .get_mut(&all[0])
            .unwrap()
            .declined
            .insert(to.into());
        let next = owner_of(&v, &all[0]).expect("an owner").to_string();
        assert_ne!(next, to);
        assert_claims_unheld(&next, &v, all[0].clone());
        assert!(plan_with_moves(to, &v, &BTreeMap::new()).is_empty());
        // Held by the next owner while `to` declines: kept there.
        let state = v.shards.get_mut(&all[0]).unwrap();
        state.holder = Some((next.clone(), 7));
        let held = BTreeMap::from([(
            all[0].clone(),
            Held {
                token: 7,
                stopping: false,
            },
        )]);
        assert_eq!(plan_with_moves(&next, &v, &held), vec![]);
        // The decline ended: back to the member it was placed on.
        v.shards.get_mut(&all[0]).unwrap().declined.clear();
        assert_eq!(
            plan_with_moves(&next, &v, &held),
            vec![Action::Release(all[0].clone())]
        );
    }

    #[test]
    fn repeated_plans_with_their_moves_settle_and_never_move_a_shard_back() {
        // Skews of 12 shards: every move is carried out, the cooldowns end, and the
        // planner is asked again, until it moves nothing.
        let all = shards(12);
        let skews: [[u64; 12]; 3] = [
            [
                9000, 8000, 7000, 100, 100, 100, 100, 100, 100, 100, 100, 100,
            ],
            [5000, 5000, 5000, 5000, 5000, 5000, 0, 0, 0, 0, 0, 0],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 30_000],
        ];
        for rates in skews {
            let mut v = settled(&all, &rates);
            let mut moved: Vec<Move> = Vec::new();
            while let Some(m) = rebalance(&v) {
                assert!(moved.len() < all.len(), "{rates:?} keeps moving: {moved:?}");
                let back = (moved.iter()).any(|p| p.shard == m.shard && p.from == m.to);
                assert!(!back, "{m:?} goes back");
                carry_out(&mut v, &m);
                // Cooling members sit one round out, then the interval ends.
                assert!(rebalance(&v).is_none_or(|n| n.from != m.to && n.to != m.from));
                v.cooling.clear();
                moved.push(m);
            }
        }
    }
}
