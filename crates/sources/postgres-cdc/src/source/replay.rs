//! Replaying a streamed step from the slot: whole transactions by their range of
//! commit ends, a quiet step by the keepalive that ended it, and a part of a large
//! transaction by its documents' indices ([`crate::position`]), on a stream opened at
//! the step's `begin` or left there (or inside the unit) by the step before.

use super::{InUnit, Phase, PostgresCdcSource, Shape, Streaming, after_handed};
use crate::position::{Part, Segments};
use crate::stream::{Item, Txn};
use crate::wire::format_lsn;
use serde_json::Value;
use sluice_source_sdk::{Records, SourceError, Step};
use std::time::Instant;

impl PostgresCdcSource {
    /// Re-reads the step `shape` of `(begin, end]` from the slot, leaving the stream
    /// after it for the steps that follow (a unit's next part replays on the same
    /// stream). Whole transactions: those ending in `(begin, end]`, whatever parts the
    /// stream hands them in. A quiet step holds none: the slot is read to the first
    /// keepalive at or past `end` (a transaction ending after it is kept for the next
    /// step), and a transaction ending inside the range is an error. A part: its
    /// documents of the first transaction committing after `begin`
    /// ([`Self::replay_part`]).
    pub(super) async fn replay_stream(
        &mut self,
        (begin, end): (u64, u64),
        segments: Segments,
        shape: Shape,
        out: &mut Records,
    ) -> Result<Step, SourceError> {
        // Where the stream must be to go on: after `begin`, inside the unit after the
        // documents before the part's.
        let at = match shape {
            Shape::Part(part) if part.from > 0 => Some(InUnit {
                lsn: part.lsn,
                next: part.from,
            }),
            _ => None,
        };
        let reuse = matches!(&self.phase, Phase::Stream(s)
            if s.stream.is_some() && s.end == begin && s.unit == at
                && s.read_ahead.pending.as_ref().is_none_or(|t| at.is_some_and(|u| t.first == u.next)));
        if !reuse {
            self.phase = Phase::Idle;
            let (stream, feedback) = self.stream_from(begin, segments.clone()).await?;
            self.phase = Phase::Stream(Box::new(Streaming::new(
                stream,
                feedback,
                begin,
                segments.clone(),
                None,
                self.paused,
            )));
        }
        if let Shape::Part(part) = shape {
            let taken = self.replay_part((begin, end), part).await?;
            return Ok(self.stream_step((begin, end), &segments, &taken, out, (false, shape)));
        }
        let quiet = matches!(shape, Shape::Quiet);
        let mut taken = Vec::new();
        if begin < end {
            let Phase::Stream(s) = &mut self.phase else {
                unreachable!("set above")
            };
            let stream = s.stream.as_mut().expect("set above");
            loop {
                let txn = match stream.next().await? {
                    Item::Sent { wal_end, caught_up } => {
                        s.caught_up |= caught_up;
                        s.sent = s.sent.max(wal_end);
                        if quiet && wal_end >= end {
                            break;
                        }
                        continue;
                    }
                    Item::Txn(txn) => txn,
                };
                // A part's commit record starts at `final_lsn` and ends at a record's
                // end: past `end` (a record's end too) exactly when it starts at or
                // after it.
                let after_end = match txn.end_lsn {
                    Some(commit) => commit > end,
                    None => txn.final_lsn >= end,
                };
                let commit = format_lsn(txn.end_lsn.unwrap_or(txn.final_lsn));
                match (quiet, after_end) {
                    (true, true) => {
                        s.read_ahead.pending = Some(txn);
                        break;
                    }
                    (true, false) => {
                        return Err(SourceError::Unavailable {
                            name: self.name.clone(),
                            position: Value::from(format_lsn(end)),
                            reason: format!(
                                "the step moved the position from {} to {} with no \
                                 transaction of the slot in between, and the slot now has \
                                 one committing at {commit}: was it dropped and created again?",
                                format_lsn(begin),
                                format_lsn(end),
                            ),
                        });
                    }
                    (false, false) => {
                        let last = txn.end_lsn == Some(end);
                        taken.push(txn);
                        if last {
                            break;
                        }
                    }
                    (false, true) => {
                        return Err(SourceError::Unavailable {
                            name: self.name.clone(),
                            position: Value::from(format_lsn(end)),
                            reason: format!(
                                "the step ended with the transaction committing at {}, and the \
                                 slot now has none ending there (next: {commit}): was it \
                                 dropped and created again?",
                                format_lsn(end),
                            ),
                        });
                    }
                }
            }
            s.end = end;
            (s.recorded, s.moved) = (end, Instant::now());
        }
        let shape = if quiet { Shape::Quiet } else { Shape::Txns };
        Ok(self.stream_step((begin, end), &segments, &taken, out, (false, shape)))
    }

    /// Re-reads the documents `[from, to)` of the first transaction committing after
    /// `begin` (to its end, which must be `end`, for a unit's last part), from the
    /// stream `replay_stream` left at `begin` or inside that transaction. Returns them
    /// as the pieces of the parts the stream hands; leaves the stream after them
    /// (what follows of a piece is kept as `pending`).
    async fn replay_part(
        &mut self,
        (begin, end): (u64, u64),
        part: Part,
    ) -> Result<Vec<Txn>, SourceError> {
        let Phase::Stream(s) = &mut self.phase else {
            unreachable!("set by replay_stream")
        };
        let stream = s.stream.as_mut().expect("set by replay_stream");
        let lost = |reason: String| SourceError::Unavailable {
            name: self.name.clone(),
            position: Value::from(format_lsn(begin)),
            reason: format!(
                "{reason}; the step held documents {}..{} of the transaction committing at \
                 {} first after it: was the slot dropped and created again?",
                part.from,
                part.to.map_or("its end".to_string(), |to| to.to_string()),
                format_lsn(part.lsn)
            ),
        };
        // The documents before the part's were handed over by earlier steps: a stream
        // opened at `begin` hands them again, and they are skipped.
        let mut unit = InUnit {
            lsn: part.lsn,
            next: part.from,
        };
        let mut taken = Vec::new();
        loop {
            let txn = match s.read_ahead.pending.take() {
                Some(txn) => txn,
                None => match stream.next().await? {
                    Item::Sent { wal_end, caught_up } => {
                        s.caught_up |= caught_up;
                        s.sent = s.sent.max(wal_end);
                        continue;
                    }
                    Item::Txn(txn) => txn,
                },
            };
            let Some(mut txn) = after_handed(unit, txn).map_err(lost)? else {
                continue;
            };
            if let Some(to) = part.to
                && txn.next() > to
            {
                s.read_ahead.pending = Some(txn.split_off(to));
            }
            unit.next = txn.next();
            let commit = txn.end_lsn;
            taken.push(txn);
            match (part.to, commit) {
                (Some(to), None) if unit.next == to => {
                    s.unit = Some(unit);
                    break;
                }
                (Some(to), Some(commit)) => {
                    return Err(lost(format!(
                        "the transaction now commits at {} after its document {} (before {to})",
                        format_lsn(commit),
                        unit.next
                    )));
                }
                (None, Some(commit)) if commit != end => {
                    return Err(lost(format!(
                        "the transaction now ends at {}, not {}",
                        format_lsn(commit),
                        format_lsn(end)
                    )));
                }
                (None, Some(_)) => {
                    s.unit = None;
                    s.end = end;
                    (s.recorded, s.moved) = (end, Instant::now());
                    break;
                }
                (_, None) => {}
            }
        }
        Ok(taken)
    }
}
