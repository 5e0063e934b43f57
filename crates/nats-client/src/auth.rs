//! `auth:`, how a connection authenticates: a user and password, a token, an NKey or a
//! credentials file (a user JWT and its NKey), exactly one of them. Secrets may be
//! written as `${ENV}` (the pipeline loader expands it) or kept in a file of their own
//! (`*_file`, relative to the pipeline file's folder); a file is read when the
//! configuration is checked and again at every connection, its trailing newline
//! dropped.

use async_nats::ConnectOptions;
use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::{InvalidConfig, resolve_path};
use std::path::{Path, PathBuf};

/// How the connection authenticates: one way only.
#[derive(Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// A user of the server's authorization block, with password or password_file.
    #[serde(default)]
    #[schemars(with = "String", length(min = 1))]
    pub user: Option<String>,
    /// The user's password; write ${ENV_VAR} to keep it out of the pipeline file.
    #[serde(default)]
    #[schemars(with = "String")]
    pub password: Option<String>,
    /// A file holding the user's password.
    #[serde(default)]
    #[schemars(with = "String")]
    pub password_file: Option<PathBuf>,
    /// A token the server's authorization block holds; write ${ENV_VAR} to keep it out
    /// of the pipeline file.
    #[serde(default)]
    #[schemars(with = "String")]
    pub token: Option<String>,
    /// A file holding the token.
    #[serde(default)]
    #[schemars(with = "String")]
    pub token_file: Option<PathBuf>,
    /// A file holding an NKey user seed (SU…, as nk -gen user or nsc writes it); the
    /// server's authorization block lists its public key.
    #[serde(default)]
    #[schemars(with = "String")]
    pub nkey_file: Option<PathBuf>,
    /// A credentials file (.creds: a user JWT and its NKey seed, as nsc writes it), for
    /// a server run in operator mode.
    #[serde(default)]
    #[schemars(with = "String")]
    pub creds_file: Option<PathBuf>,
}

/// Shows which way it authenticates, never a secret.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("keys", &self.given()).finish()
    }
}

/// The ways of authenticating, each by the keys that write it.
const WAYS: &[&[&str]] = &[
    &["user", "password", "password_file"],
    &["token", "token_file"],
    &["nkey_file"],
    &["creds_file"],
];

impl Auth {
    /// Makes relative paths relative to `base_dir` (the pipeline file's folder).
    pub fn resolve(&mut self, base_dir: &Path) {
        let files = [
            &mut self.password_file,
            &mut self.token_file,
            &mut self.nkey_file,
            &mut self.creds_file,
        ];
        for path in files.into_iter().flatten() {
            resolve_path(path, base_dir);
        }
    }

    /// The keys set, in the order [`WAYS`] lists them.
    fn given(&self) -> Vec<&'static str> {
        let set = [
            ("user", self.user.is_some()),
            ("password", self.password.is_some()),
            ("password_file", self.password_file.is_some()),
            ("token", self.token.is_some()),
            ("token_file", self.token_file.is_some()),
            ("nkey_file", self.nkey_file.is_some()),
            ("creds_file", self.creds_file.is_some()),
        ];
        set.into_iter()
            .filter(|(_, set)| *set)
            .map(|(key, _)| key)
            .collect()
    }

    /// Whom the server refused, as a message names it: `user sluice`, `the token`.
    pub(crate) fn who(&self) -> String {
        match (&self.user, &self.nkey_file, &self.creds_file) {
            (Some(user), _, _) => format!("user {user}"),
            (_, Some(path), _) => format!("the NKey of auth.nkey_file ({})", path.display()),
            (_, _, Some(path)) => {
                format!("the credentials of auth.creds_file ({})", path.display())
            }
            _ => "the token".to_string(),
        }
    }

    /// The keys to look at when the server refused them: `auth.password`.
    pub(crate) fn keys(&self) -> String {
        let keys: Vec<String> = self
            .given()
            .iter()
            .map(|key| format!("auth.{key}"))
            .collect();
        keys.join(" and ")
    }

    /// `options` authenticating this way, its files read.
    pub(crate) fn apply(&self, options: ConnectOptions) -> Result<ConnectOptions, InvalidConfig> {
        let given = self.given();
        let ways: Vec<&str> = (WAYS.iter())
            .filter_map(|keys| given.iter().copied().find(|key| keys.contains(key)))
            .collect();
        match ways.as_slice() {
            [] => Err(InvalidConfig::new(
                "auth",
                "no way of authenticating is set: write user and password, token, \
                 nkey_file or creds_file, or leave auth out",
            )),
            [_] => self.apply_one(options),
            [first, second, ..] => Err(InvalidConfig::new(
                "auth",
                format!(
                    "{first} and {second} are both set, and a connection authenticates \
                     one way: keep one of them"
                ),
            )),
        }
    }

    fn apply_one(&self, options: ConnectOptions) -> Result<ConnectOptions, InvalidConfig> {
        if let Some(user) = &self.user {
            let password =
                one_of("password", &self.password, &self.password_file)?.ok_or_else(|| {
                    InvalidConfig::new("auth.user", "a user needs its password or password_file")
                })?;
            return Ok(options.user_and_password(user.clone(), password));
        }
        if self.password.is_some() || self.password_file.is_some() {
            return Err(InvalidConfig::new(
                "auth.user",
                "a password needs its user: set user as well",
            ));
        }
        if let Some(token) = one_of("token", &self.token, &self.token_file)? {
            return Ok(options.token(token));
        }
        if let Some(path) = &self.nkey_file {
            return Ok(options.nkey(user_seed(path)?));
        }
        let path = (self.creds_file.as_ref()).expect("apply found exactly one way set");
        let creds = read_secret("auth.creds_file", path)?;
        options.credentials(&creds).map_err(|e| {
            InvalidConfig::new(
                "auth.creds_file",
                format!("{} is not a credentials file: {e}", path.display()),
            )
        })
    }
}

/// The secret written as `key` or read from `key_file`; both set is an error.
fn one_of(
    key: &str,
    written: &Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, InvalidConfig> {
    match (written, file) {
        (Some(_), Some(_)) => Err(InvalidConfig::new(
            format!("auth.{key}"),
            format!("{key} and {key}_file are both set: keep one of them"),
        )),
        (Some(secret), None) => Ok(Some(secret.clone())),
        (None, Some(path)) => read_secret(&format!("auth.{key}_file"), path).map(Some),
        (None, None) => Ok(None),
    }
}

/// The secret the file at `path` holds, without its trailing newline; the error names
/// `key` and the file, never what the file holds.
fn read_secret(key: &str, path: &Path) -> Result<String, InvalidConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InvalidConfig::new(key, format!("cannot read {}: {e}", path.display())))?;
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        return Err(InvalidConfig::new(
            key,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(secret.to_string())
}

/// The NKey user seed of the file at `path`: its first line starting `SU` (a file of
/// `nk -gen user -pubout` holds the public key too).
fn user_seed(path: &Path) -> Result<String, InvalidConfig> {
    let text = read_secret("auth.nkey_file", path)?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("SU"));
    seed.map(str::to_string).ok_or_else(|| {
        InvalidConfig::new(
            "auth.nkey_file",
            format!(
                "{} holds no NKey user seed (a line starting SU, as nk -gen user writes)",
                path.display()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::parse;

    fn applied(auth: serde_json::Value) -> Result<(), InvalidConfig> {
        let auth: Auth = parse(auth)?;
        auth.apply(ConnectOptions::new()).map(drop)
    }

    #[test]
    fn two_ways_are_an_error_naming_both() {
        for (auth, named) in [
            (
                serde_json::json!({"user": "u", "password": "p", "token": "t"}),
                "user and token",
            ),
            (
                serde_json::json!({"token_file": "t", "nkey_file": "n"}),
                "token_file and nkey_file",
            ),
            (
                serde_json::json!({"password": "p", "creds_file": "c"}),
                "password and creds_file",
            ),
        ] {
            let error = applied(auth.clone()).unwrap_err();
            assert_eq!(error.place, "auth", "{auth}");
            assert!(error.message.contains(named), "{auth}: {error}");
        }
    }

    #[test]
    fn a_way_written_in_part_says_what_is_missing() {
        for (auth, place, needle) in [
            (serde_json::json!({}), "auth", "no way of authenticating"),
            (
                serde_json::json!({"user": "u"}),
                "auth.user",
                "needs its password",
            ),
            (
                serde_json::json!({"password": "p"}),
                "auth.user",
                "needs its user",
            ),
            (
                serde_json::json!({"user": "u", "password": "p", "password_file": "f"}),
                "auth.password",
                "password and password_file are both set",
            ),
            (
                serde_json::json!({"token": "t", "token_file": "f"}),
                "auth.token",
                "token and token_file are both set",
            ),
            (
                serde_json::json!({"token_file": "/nonexistent/token"}),
                "auth.token_file",
                "cannot read /nonexistent/token",
            ),
            (
                serde_json::json!({"tokens": "t"}),
                "tokens",
                "unknown field `tokens`",
            ),
        ] {
            let error = applied(auth.clone()).unwrap_err();
            assert_eq!(error.place, place, "{auth}: {error}");
            assert!(error.message.contains(needle), "{auth}: {error}");
        }
    }

    #[test]
    fn secret_files_are_read_relative_to_the_pipeline_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "s3cret-in-file\n").unwrap();
        std::fs::write(dir.path().join("not-a-seed"), "SECRETBUTNOSEED\n").unwrap();
        let mut auth: Auth =
            parse(serde_json::json!({"user": "sluice", "password_file": "password"})).unwrap();
        auth.resolve(dir.path());
        auth.apply(ConnectOptions::new()).unwrap();
        assert_eq!(auth.who(), "user sluice");
        assert_eq!(auth.keys(), "auth.user and auth.password_file");

        let mut auth: Auth = parse(serde_json::json!({"nkey_file": "not-a-seed"})).unwrap();
        auth.resolve(dir.path());
        let error = auth.apply(ConnectOptions::new()).unwrap_err();
        assert_eq!(error.place, "auth.nkey_file");
        assert!(error.message.contains("holds no NKey user seed"), "{error}");
        assert!(!error.message.contains("SECRETBUTNOSEED"), "{error}");

        let written: Auth =
            parse(serde_json::json!({"user": "sluice", "password": "hunter2"})).unwrap();
        let shown = format!("{written:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("password"), "{shown}");
    }
}
