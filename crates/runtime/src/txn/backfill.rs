//! Backfills: a binding whose `backfill` counter was raised (and applied: its driver
//! dropped and recreated its resource) reads its sources again from the beginning.
//!
//! ```text
//!  pipeline file: bindings[i].backfill: 1 ─▶ spec (Binding.backfill) ─▶ sluice apply:
//!     driver rebuilds the resource (Apply carries last_materialization)
//!  next run, recovery: checkpoint.backfills[resource] = 0 < 1
//!     ─▶ the binding's sources' positions and its highest stored key are forgotten,
//!        checkpoint.backfills[resource] = 1
//!     ─▶ the first commit records it (log and store alike): done exactly once
//! ```
//!
//! The counter a checkpoint records is the one its data reflects, so the restart is
//! decided from the checkpoint recovery chose (pure, [`restart`]) and consumed by the
//! first commit that carries it: a crash before that commit restarts again from the
//! same store checkpoint, which still holds the old counter, and nothing was stored
//! since. A source also feeding a binding that is not backfilled would reduce its
//! documents into that binding twice: refused (`sluice apply` refuses it first, see
//! `applied::rebuilt`).

use crate::recovery::Checkpoint;
use sluice_proto::flow;

/// A source of the run and the bindings its documents feed.
pub(super) struct Feed<'a> {
    pub name: &'a str,
    pub bindings: &'a [u32],
}

/// Applies the backfills `spec` asks for to `checkpoint`, where processing begins:
/// each binding whose counter is above the one the checkpoint records has its sources'
/// positions and its highest stored key forgotten, and the checkpoint records every
/// binding's counter. Returns the sources that start over; an error names a source that
/// also feeds a binding not backfilled.
pub(super) fn restart(
    checkpoint: &mut Checkpoint,
    spec: &flow::MaterializationSpec,
    feeds: &[Feed<'_>],
) -> Result<Vec<String>, String> {
    let resource = |b: &flow::materialization_spec::Binding| b.resource_path.join(".");
    // Nothing committed yet: every source starts at the beginning anyway.
    let committed = checkpoint.txn > 0;
    let rebuilt: Vec<bool> = (spec.bindings.iter())
        .map(|b| {
            committed && b.backfill > checkpoint.backfills.get(&resource(b)).copied().unwrap_or(0)
        })
        .collect();
    let mut restarted = Vec::new();
    for feed in feeds {
        let (back, kept): (Vec<usize>, Vec<usize>) = (feed.bindings.iter())
            .map(|b| *b as usize)
            .partition(|b| rebuilt.get(*b) == Some(&true));
        match (back.first(), kept.first()) {
            (None, _) => {}
            (Some(back), Some(kept)) => {
                let (back, kept) = (&spec.bindings[*back], &spec.bindings[*kept]);
                return Err(shared_source(feed.name, &resource(back), &resource(kept)));
            }
            (Some(_), None) => {
                checkpoint.sources.remove(feed.name);
                restarted.push(feed.name.to_string());
            }
        }
    }
    for (binding, rebuilt) in spec.bindings.iter().zip(rebuilt) {
        if rebuilt {
            checkpoint.max_keys.remove(&resource(binding));
        }
        if binding.backfill > 0 {
            checkpoint
                .backfills
                .insert(resource(binding), binding.backfill);
        }
    }
    Ok(restarted)
}

/// The refusal of a backfill whose source feeds another binding too.
pub fn shared_source(source: &str, backfilled: &str, other: &str) -> String {
    format!(
        "binding {backfilled} is backfilled, but its source {source} also feeds binding \
         {other}, which is not: reading {source} again would reduce its documents into \
         {other} twice; raise the backfill of both bindings together"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(bindings: &[(&str, u32)]) -> flow::MaterializationSpec {
        flow::MaterializationSpec {
            bindings: (bindings.iter())
                .map(|(table, backfill)| flow::materialization_spec::Binding {
                    resource_path: vec![table.to_string()],
                    backfill: *backfill,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            txn: 7,
            sources: [("a", json!(10)), ("b", json!(20))]
                .into_iter()
                .map(|(s, p)| (s.to_string(), p))
                .collect(),
            max_keys: [("t", "ff"), ("u", "ee")]
                .into_iter()
                .map(|(r, k)| (r.to_string(), k.to_string()))
                .collect(),
            ..Checkpoint::default()
        }
    }

    #[test]
    fn a_raised_counter_restarts_its_sources_once() {
        let spec = spec(&[("t", 1), ("u", 0)]);
        let feeds = [
            Feed {
                name: "a",
                bindings: &[0],
            },
            Feed {
                name: "b",
                bindings: &[1],
            },
        ];
        let mut cp = checkpoint();
        assert_eq!(restart(&mut cp, &spec, &feeds).unwrap(), vec!["a"]);
        assert_eq!(cp.sources.get("a"), None, "a starts over");
        assert_eq!(cp.sources.get("b"), Some(&json!(20)));
        assert_eq!(cp.max_keys.get("t"), None, "t's keys are loaded again");
        assert_eq!(cp.backfills.get("t"), Some(&1));
        // The checkpoint committed with it records the counter: no second restart.
        let again = cp.clone();
        assert!(restart(&mut cp, &spec, &feeds).unwrap().is_empty());
        assert_eq!(cp, again);
    }

    #[test]
    fn a_first_start_only_records_the_counters() {
        let spec = spec(&[("t", 2)]);
        let feeds = [Feed {
            name: "a",
            bindings: &[0],
        }];
        let mut cp = Checkpoint {
            max_keys: [("t".to_string(), String::new())].into(),
            ..Checkpoint::default()
        };
        assert!(restart(&mut cp, &spec, &feeds).unwrap().is_empty());
        assert_eq!(cp.max_keys.get("t"), Some(&String::new()), "still tracked");
        assert_eq!(cp.backfills.get("t"), Some(&2));
    }

    #[test]
    fn a_source_feeding_a_binding_not_backfilled_is_refused() {
        let spec = spec(&[("t", 1), ("u", 0)]);
        let feeds = [Feed {
            name: "a",
            bindings: &[0, 1],
        }];
        let err = restart(&mut checkpoint(), &spec, &feeds).unwrap_err();
        assert!(
            err.contains("binding t") && err.contains("source a"),
            "{err}"
        );
        assert!(err.contains("binding u"), "{err}");
        // Raised together, both start over.
        let spec = super::tests::spec(&[("t", 1), ("u", 1)]);
        let mut cp = checkpoint();
        assert_eq!(restart(&mut cp, &spec, &feeds).unwrap(), vec!["a"]);
    }
}
