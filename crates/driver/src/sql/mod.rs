//! Pieces every table-writing driver in the authoritative pattern shares (SQLite,
//! PostgreSQL, MariaDB), whatever its client library:
//!
//! - [`unpack`]: a Store's or Load's packed key or values, back into column values.
//! - [`binding`]: a request's binding index, checked.
//! - [`PreparedCheckpoint`]: the runtime checkpoint between Prepare and Commit.
//! - [`mismatch`]: the error of a value that does not fit its column.
//! - [`Claim`] and [`RangeFence`]: an instance's claim on its key range, and the [`Error::Fenced`] of
//!   a stale one, including a store or commit that failed *because* the instance was
//!   fenced off (a zombie that believed absent a key the newer instance stored fails
//!   with the store's duplicate-key error: [`RangeFence::explain`] tells the truth).
//! - [`Table`]: a binding's columns in field-selection order, typed by the store's
//!   [`ColumnKind`].
//! - [`FencedStore`]: Prepare, Store, Commit and Acknowledge of an authoritative store
//!   whose commit is guarded by a [`RangeFence`].
//! - [`text`]: escaped, tab-separated row text for bulk loads (`COPY`, `LOAD DATA`).
//!
//! Errors here, but for [`RangeFence`]'s, are [`Error::Store`], not retryable: a malformed packed tuple or a value
//! of the wrong type fails the same way on every retry.

mod fenced;
mod table;
pub mod text;

pub use fenced::FencedStore;
pub use table::{Column, ColumnKind, Inferred, Table, spec_tables};

use crate::{Error, Result};
use serde_json::Value;
use sluice_doc::tuple;
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::Prepare;

/// The values of a packed tuple (a key or the values of a stored document), which must
/// have `want` elements; `what` names it in errors ("a stored key").
pub fn unpack(packed: &[u8], want: usize, what: &str) -> Result<Vec<Value>> {
    let values = tuple::unpack(packed)
        .map_err(|err| Error::store(format!("unpacking {what}"), err, false))?;
    if values.len() != want {
        return Err(Error::store(
            format!("unpacking {what}"),
            format!("expected {want} elements, got {}", values.len()),
            false,
        ));
    }
    Ok(values)
}

/// The binding a Load or Store names, if the materialization has it.
pub fn binding<T>(bindings: &[T], binding: u32) -> Result<&T> {
    bindings.get(binding as usize).ok_or_else(|| {
        Error::store(
            "routing a request",
            format!(
                "binding {binding} does not exist (the materialization has {})",
                bindings.len()
            ),
            false,
        )
    })
}

/// The runtime checkpoint of the transaction in progress: set by Prepare, taken by
/// Commit, which writes it in the same store transaction as the data.
#[derive(Debug, Default)]
pub struct PreparedCheckpoint(Option<Vec<u8>>);

impl PreparedCheckpoint {
    /// Remembers the runtime checkpoint of `prepare`. Returns the driver checkpoint of
    /// an authoritative store: nothing of its own (`{}` as a merge patch), since the
    /// store itself holds what it needs to resume.
    pub fn prepare(&mut self, prepare: Prepare) -> flow::DriverCheckpoint {
        self.0 = Some(prepare.flow_checkpoint);
        flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        }
    }

    /// The prepared checkpoint, for Commit; an error if no Prepare preceded it.
    pub fn take(&mut self) -> Result<Vec<u8>> {
        self.0.take().ok_or_else(|| {
            Error::store(
                "committing",
                "Commit arrived without a prepared checkpoint",
                false,
            )
        })
    }
}

/// One instance's claim on its key range, owned: the fence it must still hold to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub materialization: String,
    pub key_begin: u32,
    pub key_end: u32,
    pub fence: i64,
}

impl Claim {
    pub fn new(materialization: &str, key_begin: u32, key_end: u32, fence: i64) -> Claim {
        Claim {
            materialization: materialization.to_owned(),
            key_begin,
            key_end,
            fence,
        }
    }

    pub fn range_fence(&self) -> RangeFence<'_> {
        RangeFence {
            materialization: &self.materialization,
            key_begin: self.key_begin,
            key_end: self.key_end,
            claimed: self.fence,
        }
    }
}

/// An instance's claim on its key range of a materialization: the fence it read when
/// it opened, which its commit must still find in the range's checkpoints row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeFence<'a> {
    pub materialization: &'a str,
    pub key_begin: u32,
    pub key_end: u32,
    /// The fence claimed at open.
    pub claimed: i64,
}

impl RangeFence<'_> {
    /// The error of this instance once a newer one has opened its range; `cause` is
    /// the store's error that revealed it, if any.
    pub fn fenced(&self, cause: Option<&Error>) -> Error {
        let cause = cause
            .map(|err| format!(" (it failed with: {err})"))
            .unwrap_or_default();
        Error::Fenced(format!(
            "key range [{:08x}, {:08x}] of {:?} was opened by a newer instance \
             (this instance holds stale fence {}); its transaction was rolled back{cause}",
            self.key_begin, self.key_end, self.materialization, self.claimed
        ))
    }

    /// What a store or commit that failed with `err` really is, given the range's
    /// fence read afresh after the failure (`current`; `None` if its row is gone):
    /// [`Error::Fenced`], naming `err`, if the fence moved since this instance claimed
    /// it, else `err` itself. A failed read proves nothing, so it leaves `err` as is.
    pub fn explain(&self, err: Error, current: Result<Option<i64>>) -> Error {
        match current {
            Ok(now) if now != Some(self.claimed) && !matches!(err, Error::Fenced(_)) => {
                self.fenced(Some(&err))
            }
            Ok(_) => err,
            Err(read) => {
                tracing::debug!(%read, "reading the fence of a failed transaction");
                err
            }
        }
    }
}

/// A value that does not fit column `field`: the data's fault, named with the value
/// (cut to 80 bytes) and `why`, e.g. "does not fit a bigint column".
pub fn mismatch(field: &str, value: &Value, why: &str) -> Error {
    let mut shown = value.to_string();
    if shown.len() > 80 {
        let cut = (0..=80)
            .rev()
            .find(|&i| shown.is_char_boundary(i))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    Error::store(
        format!("converting field {field:?}"),
        format!("{shown} {why}"),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unpack_returns_the_values_and_checks_their_count() {
        let packed = tuple::pack_key(&[json!("a"), json!(7)]);
        assert_eq!(unpack(&packed, 2, "a key").unwrap(), [json!("a"), json!(7)]);
        let err = unpack(&packed, 3, "a stored key").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unpacking a stored key: expected 3 elements, got 2"
        );
        assert!(unpack(&[0xff, 0x00], 1, "a key").is_err());
    }

    #[test]
    fn a_binding_out_of_range_is_an_error_naming_the_count() {
        assert_eq!(binding(&["t0", "t1"], 1).unwrap(), &"t1");
        let err = binding(&["t0"], 3).unwrap_err();
        assert!(
            err.to_string().contains("binding 3 does not exist"),
            "{err}"
        );
        assert!(err.to_string().contains("has 1"), "{err}");
    }

    #[test]
    fn commit_takes_the_prepared_checkpoint_once() {
        let mut prepared = PreparedCheckpoint::default();
        let driver = prepared.prepare(Prepare {
            flow_checkpoint: b"cp1".to_vec(),
        });
        assert_eq!(driver.driver_checkpoint_json, b"{}");
        assert!(driver.rfc7396_merge_patch);
        assert_eq!(prepared.take().unwrap(), b"cp1");
        let err = prepared.take().unwrap_err();
        assert!(
            err.to_string().contains("without a prepared checkpoint"),
            "{err}"
        );
    }

    #[test]
    fn a_failure_is_fenced_only_if_the_fence_moved() {
        let range = RangeFence {
            materialization: "m",
            key_begin: 0,
            key_end: u32::MAX,
            claimed: 3,
        };
        let duplicate = || Error::store("storing", "duplicate key", false);
        let err = range.explain(duplicate(), Ok(Some(4)));
        assert!(matches!(err, Error::Fenced(_)), "{err}");
        assert!(err.to_string().contains("stale fence 3"), "{err}");
        assert!(err.to_string().contains("duplicate key"), "{err}");
        let err = range.explain(duplicate(), Ok(None));
        assert!(matches!(err, Error::Fenced(_)), "{err}");
        let err = range.explain(duplicate(), Ok(Some(3)));
        assert!(matches!(err, Error::Store { .. }), "{err}");
        let err = range.explain(duplicate(), Err(Error::Transport("lost".into())));
        assert!(matches!(err, Error::Store { .. }), "{err}");
        let fenced = range.explain(range.fenced(None), Ok(Some(4)));
        assert_eq!(fenced.to_string(), range.fenced(None).to_string());
    }

    #[test]
    fn a_mismatch_names_the_field_and_cuts_long_values() {
        let err = mismatch("n", &json!("seven"), "does not fit a bigint column");
        assert_eq!(
            err.to_string(),
            "converting field \"n\": \"seven\" does not fit a bigint column"
        );
        let long = json!("é".repeat(100));
        let message = mismatch("s", &long, "is too long").to_string();
        assert!(message.contains("…"), "{message}");
        assert!(message.len() < 140, "{message}");
    }
}
