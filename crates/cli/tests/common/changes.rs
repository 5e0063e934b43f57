//! What the change-stream tests share: a stream's stamped messages grouped into
//! transactions' batches (each batch's indexes once each, in order), and a JSON
//! `insert_delete` stream replayed into the view it says, each change checked against it.

use super::Row;
use serde_json::Value;
use std::collections::BTreeMap;

/// Groups messages stamped (txn, index) into batches, checking each batch's indexes
/// run 0, 1, 2, … once each.
pub fn group(messages: impl IntoIterator<Item = (u64, u64, String)>) -> Vec<(u64, Vec<String>)> {
    let mut batches: Vec<(u64, Vec<String>)> = Vec::new();
    for (txn, index, value) in messages {
        if batches.last().is_none_or(|(t, _)| *t != txn) {
            assert!(
                batches.iter().all(|(t, _)| *t < txn),
                "transaction {txn} out of order"
            );
            batches.push((txn, Vec::new()));
        }
        let lines = &mut batches.last_mut().unwrap().1;
        assert_eq!(
            index,
            lines.len() as u64,
            "transaction {txn}: index out of sequence"
        );
        lines.push(value.trim_end().to_string());
    }
    batches
}

/// Applies a generation's `json` changes, in order, to a view that starts empty. A
/// change that does not fit the view fails, naming it: an insert of a key the view
/// holds (with no delete before it), a delete of a document the view does not hold.
pub fn replay(batches: &[(u64, Vec<String>)]) -> BTreeMap<String, Row> {
    let mut view = BTreeMap::new();
    for (txn, lines) in batches {
        for line in lines {
            let record: Value = serde_json::from_str(line).unwrap();
            match (record.get("insert"), record.get("delete")) {
                (Some(doc), None) => {
                    let user = doc["user_id"].as_str().unwrap().to_string();
                    let held = view.insert(user.clone(), Row::of(doc));
                    assert!(
                        held.is_none(),
                        "transaction {txn} inserts {line} but the view holds {user} \
                         ({held:?}) and no delete came before it"
                    );
                }
                (None, Some(doc)) => {
                    let user = doc["user_id"].as_str().unwrap();
                    let held = view.remove(user);
                    assert_eq!(
                        held,
                        Some(Row::of(doc)),
                        "transaction {txn} deletes {line}, which the view does not hold"
                    );
                }
                _ => panic!("not an insert_delete record: {line}"),
            }
        }
    }
    view
}
