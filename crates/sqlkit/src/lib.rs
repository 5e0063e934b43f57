//! The SQL kit: what every table-writing driver in the authoritative pattern shares
//! (SQLite, PostgreSQL, MariaDB), whatever its client library:
//!
//! - [`config`]: strict parsing of endpoint and resource configs, and their schemas.
//! - [`validate`]: Validate's constraint rules over a store's column kinds.
//! - [`unpack`]: a Store's or Load's packed key or values, back into column values.
//! - [`binding`]: a request's binding index, checked.
//! - [`mismatch`]: the error of a value that does not fit its column.
//! - [`Table`]: a binding's columns in field-selection order, typed by the store's
//!   [`ColumnKind`].
//! - [`text`]: escaped, tab-separated row text for bulk loads (`COPY`, `LOAD DATA`).
//! - [`apply`]: Apply planned once over a store's [`apply::Catalog`] and its
//!   [`apply::Ddl`]; Spec's and Validate's answers.
//! - [`tls`]: the one verification rule, the CA file a connection URL names, and why a
//!   TLS handshake failed.
//! - [`connect`]: a connection attempt's bound, and its errors' retryability.
//! - [`fence`]: the claim protocol and the fenced commit over a checkpoints table, once,
//!   over a dialect's statements and client calls.
//!
//! The fencing a store commits under ([`sluice_driver_sdk::fence::Claim`], the
//! [`sluice_driver_sdk::fence::FencedStore`] trait) is the driver SDK's: it is not
//! SQL-specific. What is SQL-specific (the checkpoints table) is [`fence`] here.
//!
//! Errors here are [`Error::Store`], not retryable: a malformed packed tuple or a value
//! of the wrong type fails the same way on every retry.

pub mod apply;
pub mod config;
pub mod connect;
pub mod fence;
mod table;
pub mod text;
pub mod tls;
pub mod validate;

pub use table::{Column, ColumnKind, Inferred, Table, spec_tables};

use serde_json::Value;
use sluice_doc::tuple;
use sluice_driver_sdk::{Error, Result};

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
