//! Replaying a streamed step from the binary log: whole transactions by their range of
//! ends, and a part of a large transaction by its documents' indices
//! ([`crate::position`]), on a stream opened at the step's `begin`.

use super::MysqlCdcSource;
use crate::binlog::{Item, Txn};
use crate::position::{BinlogPos, Part, Segments};
use serde_json::Value;
use sluice_source_sdk::SourceError;

impl MysqlCdcSource {
    fn gone(&self, end: &BinlogPos, reason: String) -> SourceError {
        SourceError::Unavailable {
            name: self.name.clone(),
            position: Value::from(end.to_string()),
            reason: format!(
                "{reason}: was the server's log reset (RESET MASTER) or the server \
                 restored from a backup?"
            ),
        }
    }

    /// The next whole transaction of the stream (its parts put together), or an error
    /// when the server has nothing more.
    async fn next_whole(
        &self,
        dump: &mut crate::binlog::Dump,
        end: &BinlogPos,
    ) -> Result<Txn, SourceError> {
        let mut merged: Option<Txn> = None;
        loop {
            let txn = match dump.next().await? {
                Item::Heartbeat { .. } => {
                    return Err(self.gone(
                        end,
                        format!("the step ended at {end}, and the server's binary log now ends before it"),
                    ));
                }
                Item::Txn(txn) => txn,
            };
            let txn = match merged.take() {
                Some(mut before) => {
                    before.append(txn);
                    before
                }
                None => txn,
            };
            if txn.end.is_some() {
                return Ok(txn);
            }
            merged = Some(txn);
        }
    }

    /// Re-reads the whole transactions ending in `(begin, end]`.
    pub(super) async fn replay_txns(
        &mut self,
        (begin, end): (&BinlogPos, &BinlogPos),
        segments: Segments,
    ) -> Result<Vec<Txn>, SourceError> {
        let mut taken = Vec::new();
        if begin >= end {
            return Ok(taken);
        }
        let mut dump = self.dump_from(begin, None, segments).await?.dump;
        loop {
            let txn = self.next_whole(&mut dump, end).await?;
            let ends = txn.end.clone().expect("whole");
            match ends.cmp(end) {
                std::cmp::Ordering::Less => taken.push(txn),
                std::cmp::Ordering::Equal => {
                    taken.push(txn);
                    return Ok(taken);
                }
                std::cmp::Ordering::Greater => {
                    return Err(self.gone(
                        end,
                        format!(
                            "the step ended with the transaction ending at {end}, and the \
                             server's binary log now has none ending there (next: {ends})"
                        ),
                    ));
                }
            }
        }
    }

    /// Re-reads the documents `[from, to)` of the first transaction ending after
    /// `begin` (to its end, which must be `end`, for a unit's last part). Holds no
    /// more of the transaction than the part: documents before `from` are dropped as
    /// they come.
    pub(super) async fn replay_part(
        &mut self,
        (begin, end): (&BinlogPos, &BinlogPos),
        part: Part,
        segments: Segments,
    ) -> Result<Txn, SourceError> {
        let mut dump = self.dump_from(begin, None, segments).await?.dump;
        let mut held: Option<Txn> = None;
        loop {
            let txn = match dump.next().await? {
                Item::Heartbeat { .. } => {
                    return Err(self.gone(
                        end,
                        format!("the step held a part of the transaction after {begin}, and the server's binary log now ends before its end"),
                    ));
                }
                Item::Txn(txn) => txn,
            };
            let mut txn = match held.take() {
                Some(mut before) => {
                    before.append(txn);
                    before
                }
                None => txn,
            };
            if txn.first < part.from {
                txn = txn.split_off(part.from);
            }
            match (part.to, &txn.end) {
                (Some(to), _) if txn.next() >= to => {
                    txn.split_off(to);
                    return Ok(txn);
                }
                (Some(to), Some(ends)) => {
                    return Err(self.gone(
                        end,
                        format!(
                            "the transaction after {begin} now ends at {ends} after its \
                             document {} (before {to})",
                            txn.next()
                        ),
                    ));
                }
                (None, Some(ends)) if ends != end => {
                    return Err(self.gone(
                        end,
                        format!("the transaction after {begin} now ends at {ends}, not {end}"),
                    ));
                }
                (None, Some(_)) => return Ok(txn),
                (_, None) => held = Some(txn),
            }
        }
    }
}
