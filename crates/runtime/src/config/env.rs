//! `${NAME}` and `${NAME:-default}` in the pipeline file's strings, expanded from the
//! environment before the file is read, and a record of every default taken: a spec
//! that changed only because a variable was forgotten (unset, so its default stood in)
//! can then say so where the change is shown, rather than leave the reader to guess.
//! `${file:PATH}` expands to a file's content (one trailing newline dropped; a relative
//! PATH is the pipeline folder's), so any secret (a password, a token, a URL) can live
//! in a file a secret manager mounts rather than in the file or the environment.

use super::{ConfigError, invalid};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// A `${NAME:-default}` that expanded to its default, NAME being unset or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaulted {
    /// The variable, `DB_PATH`.
    pub var: String,
    /// The default it fell back to.
    pub default: String,
    /// The dotted place of the string it is in (`materializations.m.endpoint.sqlite.path`).
    pub place: String,
    /// The variable was set, to the empty string (else: not set at all).
    pub empty: bool,
}

impl Defaulted {
    /// `the default of ${DB_PATH:-b}: DB_PATH is not set`.
    pub fn explain(&self) -> String {
        let Defaulted {
            var,
            default,
            empty,
            ..
        } = self;
        let why = if *empty { "is empty" } else { "is not set" };
        format!("the default of ${{{var}:-{default}}}: {var} {why}")
    }

    /// Whether it lies in the value at `place`: that place, or one inside it.
    pub fn within(&self, place: &str) -> bool {
        self.place
            .strip_prefix(place)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    }
}

/// Expands `${NAME}` and `${NAME:-default}` in every string of `tree`; `place` tracks
/// where we are, and each default taken is added to `defaulted`.
pub(super) fn expand(
    tree: &mut Value,
    place: &mut String,
    base_dir: &Path,
    defaulted: &mut Vec<Defaulted>,
) -> Result<(), ConfigError> {
    let len = place.len();
    match tree {
        Value::String(s) if s.contains('$') => *s = expand_str(s, place, base_dir, defaulted)?,
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let _ = write!(place, "[{i}]");
                expand(item, place, base_dir, defaulted)?;
                place.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if !place.is_empty() {
                    place.push('.');
                }
                place.push_str(key);
                expand(value, place, base_dir, defaulted)?;
                place.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

fn expand_str(
    s: &str,
    place: &str,
    base_dir: &Path,
    defaulted: &mut Vec<Defaulted>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let Some(end) = after.find('}') else {
                return Err(invalid(place, format!("unclosed ${{ in {s:?}")));
            };
            let (var, default) = match after[..end].split_once(":-") {
                Some((var, default)) => (var, Some(default)),
                None => (&after[..end], None),
            };
            let found = match var.strip_prefix("file:") {
                Some(path) => read_secret(place, &base_dir.join(path), default.is_some())?,
                None => std::env::var(var).map_err(|_| ()),
            };
            let value = match (found, default) {
                (Ok(value), None) => value,
                (Ok(value), Some(_)) if !value.is_empty() => value,
                (set, Some(default)) => {
                    defaulted.push(Defaulted {
                        var: var.to_owned(),
                        default: default.to_owned(),
                        place: place.to_owned(),
                        empty: set.is_ok(),
                    });
                    default.to_owned()
                }
                (Err(()), None) => {
                    return Err(invalid(
                        place,
                        format!(
                            "environment variable ${{{var}}} is not set (write ${{{var}:-default}} \
                             for a default, $${{ for a literal ${{)"
                        ),
                    ));
                }
            };
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The content of the secret file `path` of a `${file:…}` (one trailing newline
/// dropped); `Err(())` when it is missing and a default stands in.
fn read_secret(
    place: &str,
    path: &Path,
    has_default: bool,
) -> Result<Result<String, ()>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let text = text.strip_suffix('\n').unwrap_or(&text);
            Ok(Ok(text.strip_suffix('\r').unwrap_or(text).to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && has_default => Ok(Err(())),
        Err(e) => Err(invalid(
            place,
            format!(
                "cannot read the file {} of ${{file:…}}: {e}",
                path.display()
            ),
        )),
    }
}
