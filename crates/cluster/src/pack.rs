//! A pending intent as a shard's etcd log stores it (pure): each source's steps after
//! its first carry their position as a patch of the position before, so the record
//! grows with what each step changed, not with the whole position times the steps.
//!
//! ```text
//!  Intent {steps: {kafka: [R1, R2, R3]}}             (each Ri: a whole position)
//!      ──pack──▶ {"packed": 1, "steps": {"kafka": [R1, R2 − R1, R3 − R2]}, ...}
//!  where  Ri − Rj  =  {kind, hash, data?, "patch": diff(position j, position i)}
//! ```
//!
//! Why: a Kafka step's position names every partition's next offset (a restart resumes
//! each from it), but a step reads few of them. At 500 partitions a position is about
//! 7 KiB, and a transaction's intent, one position per step, passed etcd's 1 MiB at
//! about 150 steps: every holder in turn failed with `TooLarge` (not retryable). Packed,
//! a step costs the partitions it read; the first step, and the commit record (the last
//! step's whole position), cost the whole position once.
//!
//! A patch node is `{"=": value}` (the value replaced) or an edit of an object, `{"~":
//! {key: node, ...}, "-": [removed keys]}` (either part may be missing; `{}` changes
//! nothing). Each node is whichever of the two is shorter, so a patch is never longer
//! than the position it stands for (plus a few bytes). Unpacking gives back exactly the
//! intent packed (`unpack(pack(i)) == i`); an intent written by the previous release
//! (no `packed` key) reads as it was written.

use serde_json::{Map, Value};
use sluice_runtime::recovery::Intent;

/// The packed format's version, the value of its `packed` key.
const PACKED: u64 = 1;

/// `intent` as the etcd log stores it.
pub fn pack(intent: &Intent) -> Value {
    let mut value = serde_json::to_value(intent).expect("an intent serializes");
    let object = value.as_object_mut().expect("an intent is an object");
    if let Some(Value::Object(sources)) = object.get_mut("steps") {
        for steps in sources.values_mut() {
            let Value::Array(steps) = steps else { continue };
            let mut before: Option<Value> = None;
            for step in steps {
                let Some(step) = step.as_object_mut() else {
                    continue;
                };
                let Some(position) = step.remove("position") else {
                    continue;
                };
                match &before {
                    Some(base) => {
                        step.insert("patch".into(), diff(base, &position));
                    }
                    None => {
                        step.insert("position".into(), position.clone());
                    }
                }
                before = Some(position);
            }
        }
    }
    object.insert("packed".into(), PACKED.into());
    value
}

/// The intent stored as `bytes`, packed or not.
pub fn unpack(bytes: &[u8]) -> Result<Intent, String> {
    let mut value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let object = value.as_object_mut().ok_or("not an object")?;
    match object.remove("packed") {
        None => {}
        Some(v) if v == PACKED => unpack_steps(object)?,
        Some(v) => {
            return Err(format!(
                "packed in format {v}, newer than this version reads ({PACKED}): run the \
                 newer sluice"
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn unpack_steps(intent: &mut Map<String, Value>) -> Result<(), String> {
    let Some(Value::Object(sources)) = intent.get_mut("steps") else {
        return Ok(());
    };
    for (source, steps) in sources.iter_mut() {
        let Value::Array(steps) = steps else { continue };
        let mut before: Option<Value> = None;
        for (i, step) in steps.iter_mut().enumerate() {
            let Some(step) = step.as_object_mut() else {
                continue;
            };
            let position = match (step.remove("patch"), step.get("position")) {
                (Some(patch), None) => {
                    let base = before.as_ref().ok_or_else(|| {
                        format!("step {i} of source {source:?} patches no earlier position")
                    })?;
                    let position = apply(base, &patch)
                        .map_err(|e| format!("step {i} of source {source:?}: {e}"))?;
                    step.insert("position".into(), position.clone());
                    position
                }
                (None, Some(position)) => position.clone(),
                (None, None) => continue,
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "step {i} of source {source:?} has both a position and a patch"
                    ));
                }
            };
            before = Some(position);
        }
    }
    Ok(())
}

/// The patch turning `from` into `to`.
pub fn diff(from: &Value, to: &Value) -> Value {
    let replace = || Value::Object(Map::from_iter([("=".to_string(), to.clone())]));
    let (Value::Object(from), Value::Object(to_map)) = (from, to) else {
        return match from == to {
            true => Value::Object(Map::new()),
            false => replace(),
        };
    };
    let mut changed = Map::new();
    for (key, value) in to_map {
        match from.get(key) {
            Some(old) if old == value => {}
            Some(old) => {
                changed.insert(key.clone(), diff(old, value));
            }
            None => {
                let node = Map::from_iter([("=".to_string(), value.clone())]);
                changed.insert(key.clone(), Value::Object(node));
            }
        }
    }
    let removed: Vec<Value> = (from.keys())
        .filter(|key| !to_map.contains_key(*key))
        .map(|key| Value::String(key.clone()))
        .collect();
    let mut edit = Map::new();
    if !changed.is_empty() {
        edit.insert("~".into(), Value::Object(changed));
    }
    if !removed.is_empty() {
        edit.insert("-".into(), Value::Array(removed));
    }
    let edit = Value::Object(edit);
    let replace = replace();
    match encoded_len(&edit) < encoded_len(&replace) {
        true => edit,
        false => replace,
    }
}

/// `base` with `patch` applied.
pub fn apply(base: &Value, patch: &Value) -> Result<Value, String> {
    let patch = patch.as_object().ok_or("a patch node is an object")?;
    if let Some(value) = patch.get("=") {
        return Ok(value.clone());
    }
    if patch.is_empty() {
        return Ok(base.clone());
    }
    let mut object = base
        .as_object()
        .ok_or("an edit of a value that is not an object")?
        .clone();
    if let Some(removed) = patch.get("-") {
        for key in removed.as_array().ok_or("`-` is a list of keys")? {
            object.remove(key.as_str().ok_or("`-` is a list of keys")?);
        }
    }
    if let Some(changed) = patch.get("~") {
        for (key, node) in changed.as_object().ok_or("`~` is an object")? {
            let value = match object.get(key) {
                Some(old) => apply(old, node)?,
                None => (node.get("=").cloned()).ok_or_else(|| format!("key {key:?} is new"))?,
            };
            object.insert(key.clone(), value);
        }
    }
    Ok(Value::Object(object))
}

fn encoded_len(value: &Value) -> usize {
    serde_json::to_vec(value).expect("a value serializes").len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::Resume;
    use std::collections::BTreeMap;

    fn replay(position: Value, hash: u64) -> Resume {
        Resume::Replay {
            position,
            data: None,
            hash,
        }
    }

    fn intent(steps: Vec<(&str, Vec<Resume>)>) -> Intent {
        Intent {
            txn: 7,
            steps: (steps.into_iter())
                .map(|(name, steps)| (name.to_string(), steps))
                .collect(),
            artifacts: BTreeMap::from([("views".to_string(), json!({"dir": "e7"}))]),
        }
    }

    /// A Kafka-shaped position: every partition's next offset, the ranges read.
    fn kafka(partitions: i64, read: &[(i64, i64, i64)]) -> Value {
        let mut next: BTreeMap<String, i64> = (0..partitions).map(|p| (p.to_string(), 0)).collect();
        let mut ranges = BTreeMap::new();
        for &(p, begin, end) in read {
            next.insert(p.to_string(), end);
            ranges.insert(p.to_string(), json!([begin, end]));
        }
        json!({"next": next, "read": ranges})
    }

    #[test]
    fn diffs_apply_back_to_their_target() {
        let values = [
            json!(null),
            json!(1),
            json!("x"),
            json!([1, 2]),
            json!({}),
            json!({"a": 1, "b": {"c": null, "d": [1]}}),
            json!({"a": 2, "b": {"c": 3}, "e": null}),
            json!({"a": 1, "b": 5}),
            json!({"=": 1, "~": {"-": ["a"]}}),
        ];
        for from in &values {
            for to in &values {
                let patch = diff(from, to);
                assert_eq!(&apply(from, &patch).unwrap(), to, "{from} → {to}: {patch}");
                assert!(
                    encoded_len(&patch) <= encoded_len(to) + 6,
                    "{from} → {to}: {patch}"
                );
            }
        }
    }

    #[test]
    fn a_packed_intent_unpacks_to_itself_and_costs_what_its_steps_changed() {
        let mut steps = Vec::new();
        let mut read = Vec::new();
        for i in 0..200 {
            // Each step reads one partition's next 10 offsets.
            let p = i % 500;
            read.push((p, i * 10, i * 10 + 10));
            steps.push(replay(kafka(500, &read[read.len() - 1..]), i as u64));
        }
        // Positions only grow here; later steps of the next partitions read more.
        let whole = intent(vec![
            ("kafka", steps),
            ("file", vec![Resume::Barrier]),
            (
                "mixed",
                vec![
                    Resume::Barrier,
                    Resume::Seek {
                        position: json!({"offset": 3}),
                    },
                    Resume::Barrier,
                    Resume::Replay {
                        position: json!({"offset": 5}),
                        data: Some(b"abc".to_vec()),
                        hash: 9,
                    },
                    Resume::Seek {
                        position: json!({"offset": 5}),
                    },
                ],
            ),
        ]);
        let plain = serde_json::to_vec(&whole).unwrap();
        let packed = serde_json::to_vec(&pack(&whole)).unwrap();
        assert_eq!(unpack(&packed).unwrap(), whole);
        assert_eq!(
            unpack(&plain).unwrap(),
            whole,
            "the previous release's intent"
        );
        // One whole position (500 partitions) and 199 patches of about 120 bytes.
        let position = encoded_len(&kafka(500, &[]));
        assert!(plain.len() > 200 * position, "{}", plain.len());
        assert!(
            packed.len() < position + 200 * 160,
            "{} bytes packed, {} plain",
            packed.len(),
            plain.len()
        );
    }

    #[test]
    fn a_patch_without_a_base_or_a_newer_format_is_an_error() {
        let orphan = json!({"txn": 1, "packed": 1, "steps": {"s": [
            {"kind": "replay", "patch": {}, "hash": 1}
        ]}});
        let err = unpack(&serde_json::to_vec(&orphan).unwrap()).unwrap_err();
        assert!(err.contains("patches no earlier position"), "{err}");
        let newer = json!({"txn": 1, "packed": 2, "steps": {}});
        let err = unpack(&serde_json::to_vec(&newer).unwrap()).unwrap_err();
        assert!(err.contains("newer"), "{err}");
    }
}
