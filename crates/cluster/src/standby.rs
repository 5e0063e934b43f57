//! A member's standby listeners: under `cluster:` every member listens on the address
//! of each source that listens for its input (an HTTP server), and only the member
//! holding that source's shard serves there. Elsewhere the source kind's
//! [`Standby`] answers, naming the holder (a 503 for HTTP), so a client behind a load
//! balancer retries and lands on the holder.
//!
//! ```text
//!  join:   start a standby per listening source; publish their addresses in
//!          P/members/<me> {"pid", "listens": {source: address}}
//!  each look at the cluster: tell each standby the holder of its materialization's
//!          shard and the address that member published ([`holder_of`], pure)
//!  claim:  stop the materialization's standbys (awaited: the address is free), then
//!          launch its loop, whose source binds the address
//!  the loop ended here (handed over, declined, dropped): start them again
//! ```

use crate::assign::View;
use crate::etcd::KeyValue;
use crate::keys::Keys;
use serde::{Deserialize, Serialize};
use sluice_runtime::config::Pipeline;
use sluice_source_sdk::SourceConfig;
use sluice_source_sdk::kind::{Holder, Standby};
use std::collections::BTreeMap;

/// Source name → the address it listens on, as one member publishes it.
pub type Listens = BTreeMap<String, String>;

/// The value of `P/members/<member>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberValue {
    pub pid: u32,
    /// The addresses of its listening sources (absent: it publishes none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub listens: Listens,
}

/// Each live member's published addresses, read from the `P/members/` keys (a value
/// that does not read, as one of an earlier release, publishes none).
pub fn read_listens(keys: &Keys, members: &[KeyValue]) -> BTreeMap<String, Listens> {
    let prefix = keys.members();
    (members.iter())
        .filter_map(|kv| {
            let member = String::from_utf8_lossy(&kv.key)
                .strip_prefix(&prefix)?
                .to_string();
            let value: MemberValue = serde_json::from_slice(&kv.value).ok()?;
            Some((member, value.listens))
        })
        .collect()
}

/// Who a standby of `source` (read by `materialization`) names: the member holding the
/// materialization's shard, with the address it published for the source; `None`
/// while nobody holds it, or while it is this member's own (between its loop ending and
/// the hand-over).
pub fn holder_of(
    me: &str,
    view: &View,
    listens: &BTreeMap<String, Listens>,
    materialization: &str,
    source: &str,
) -> Option<Holder> {
    let member = (view.shards.iter())
        .filter(|(id, _)| id.materialization == materialization)
        .find_map(|(_, state)| state.holder.as_ref().map(|(member, _)| member))
        .filter(|member| *member != me)?;
    Some(Holder {
        member: member.clone(),
        address: listens.get(member).and_then(|l| l.get(source)).cloned(),
    })
}

/// One listening source of the pipeline and its standby, when running.
struct Slot {
    materialization: String,
    config: SourceConfig,
    address: String,
    running: Option<Box<dyn Standby>>,
}

/// A member's standbys, by source name.
pub struct Standbys {
    slots: BTreeMap<String, Slot>,
}

impl Standbys {
    /// Starts a standby for every source of `pipeline` whose kind listens (on a Tokio
    /// runtime: each binds on a task of its own).
    pub fn start(pipeline: &Pipeline) -> Standbys {
        let mut slots = BTreeMap::new();
        for materialization in pipeline.materializations.keys() {
            for (source, def) in pipeline.sources_of(materialization) {
                if slots.contains_key(source) {
                    continue; // Read by two materializations: the source refuses that.
                }
                let Some(standby) = def.config.standby(source) else {
                    continue;
                };
                let slot = Slot {
                    materialization: materialization.clone(),
                    config: def.config.clone(),
                    address: standby.address(),
                    running: Some(standby),
                };
                slots.insert(source.clone(), slot);
            }
        }
        Standbys { slots }
    }

    /// What this member publishes: each listening source's address.
    pub fn addresses(&self) -> Listens {
        (self.slots.iter())
            .map(|(source, slot)| (source.clone(), slot.address.clone()))
            .collect()
    }

    /// Tells each running standby whom to name, from a look at the cluster.
    pub fn follow(&self, me: &str, view: &View, listens: &BTreeMap<String, Listens>) {
        for (source, slot) in &self.slots {
            if let Some(standby) = &slot.running {
                standby.set_holder(holder_of(me, view, listens, &slot.materialization, source));
            }
        }
    }

    /// Stops the standbys of `materialization`'s sources, before this member runs its
    /// shard: after this returns, their addresses are free for the sources.
    pub async fn stop_for(&mut self, materialization: &str) {
        for slot in self.slots.values_mut() {
            if slot.materialization == materialization
                && let Some(standby) = slot.running.take()
            {
                standby.stop().await;
            }
        }
    }

    /// Starts the standbys of `materialization`'s sources again: this member no longer
    /// runs its shard.
    pub fn resume_for(&mut self, materialization: &str) {
        for (source, slot) in &mut self.slots {
            if slot.materialization == materialization && slot.running.is_none() {
                slot.running = slot.config.standby(source);
            }
        }
    }

    /// Stops every standby (the member is leaving).
    pub async fn stop_all(&mut self) {
        for slot in self.slots.values_mut() {
            if let Some(standby) = slot.running.take() {
                standby.stop().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign::ShardState;
    use crate::keys::{ShardDef, ShardId};

    fn view(holders: &[(&str, Option<&str>)]) -> View {
        let mut view = View::default();
        for (materialization, holder) in holders {
            let id = ShardId {
                materialization: materialization.to_string(),
                range: ShardDef::default(),
            };
            let state = ShardState {
                holder: holder.map(|m| (m.to_string(), 7)),
                ..ShardState::default()
            };
            view.shards.insert(id, state);
        }
        view
    }

    #[test]
    fn a_standby_names_the_holder_of_its_materialization_and_its_published_address() {
        let listens = BTreeMap::from([(
            "b".to_string(),
            Listens::from([("views".to_string(), "10.0.0.6:8080".to_string())]),
        )]);
        let v = view(&[("views-db", Some("b")), ("other", Some("c"))]);
        let named = holder_of("a", &v, &listens, "views-db", "views");
        assert_eq!(
            named,
            Some(Holder {
                member: "b".into(),
                address: Some("10.0.0.6:8080".into())
            })
        );
        // A holder that published no address for the source is named by its id.
        let named = holder_of("a", &v, &listens, "other", "views");
        assert_eq!(
            named.map(|h| (h.member, h.address)),
            Some(("c".into(), None))
        );
        // Nobody holds it, or this member does (its loop ended, it hands over): none.
        assert_eq!(
            holder_of(
                "a",
                &view(&[("views-db", None)]),
                &listens,
                "views-db",
                "views"
            ),
            None
        );
        assert_eq!(holder_of("b", &v, &listens, "views-db", "views"), None);
    }

    #[test]
    fn a_member_value_of_an_earlier_release_publishes_no_address() {
        let keys = Keys::new("/p");
        let kv = |member: &str, value: &str| KeyValue {
            key: keys.member(member).into_bytes(),
            value: value.as_bytes().to_vec(),
            ..KeyValue::default()
        };
        let read = read_listens(
            &keys,
            &[
                kv("a", r#"{"pid": 1}"#),
                kv("b", r#"{"pid": 2, "listens": {"views": "h:1"}}"#),
            ],
        );
        assert_eq!(read["a"], Listens::new());
        assert_eq!(read["b"]["views"], "h:1");
    }
}
