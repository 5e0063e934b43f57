//! S3 and S3-compatible object stores, for what writes files there: the Iceberg sink's
//! warehouse and the files output. Neither depends on the other, so the settings a user
//! writes ([`S3Settings`], the `s3:` block of both) and the one place an S3 client is
//! built ([`S3Store::connect`]) live here, as the Kafka and NATS client settings live in
//! crates of their own.
//!
//! ```text
//!  s3://bucket/prefix  ─▶ S3Url {bucket, prefix}
//!  S3Settings          ─▶ S3Store (object_store's AmazonS3: one bucket)
//!                          list(prefix) · put_new(key) (If-None-Match: *) · get · delete(keys)
//!                          · delete_prefix(prefix) · inner() for a streaming writer
//! ```
//!
//! What an object store lacks, and what the writers here do instead:
//! - No rename: a file is never written under a temporary name and moved. Every attempt
//!   writes names of its own (a process nonce, a UUID), and where one name may be written
//!   twice, [`S3Store::put_new`] sends a conditional put (`If-None-Match: *`): the second
//!   writer is told [`Created::AlreadyThere`] and nothing is overwritten. An object is
//!   visible whole or not at all once its PUT (or multipart completion) returns.
//! - No fsync: a PUT that returned is durable (S3's promise); one that did not may or may
//!   not have landed, and the writer's own identity in the name is what tells later.
//! - Listing is consistent after a write (S3 has been strongly read-after-write
//!   consistent since December 2020; the local test server is too).
//!
//! Credentials: `access_key_id`/`secret_access_key` when set (both or neither), else the
//! environment as AWS's own tools read it (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`...), else the instance's role.

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

pub use object_store;

/// How long one request may take: 30 s. Writers send objects of up to a multipart part
/// (10 MiB) or a small file per request; anything near this is a stuck store.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the client keeps retrying one call (throttling, 5xx, broken connections):
/// 60 s, half the Iceberg sink's two-minute call deadline, so a store that stays down
/// surfaces as the call's error (retried by the runtime) rather than as its timeout.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an S3 store is and who we are to it (every field optional: the environment
/// fills what is left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "S3 settings")]
pub struct S3Settings {
    /// The S3 API's address, for an S3-compatible store (`http://127.0.0.1:9000`); AWS's
    /// regional endpoint when left out (or AWS_ENDPOINT_URL)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub endpoint: Option<String>,
    /// The bucket's region (AWS_REGION when left out, else us-east-1)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub region: Option<String>,
    /// Access key id, with secret_access_key (AWS_ACCESS_KEY_ID when both are left out)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub access_key_id: Option<String>,
    /// Secret access key, with access_key_id (AWS_SECRET_ACCESS_KEY when both are left out)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub secret_access_key: Option<String>,
    /// Name the bucket in the path (`http://host/bucket/key`) rather than in the host
    /// name: what most S3-compatible servers need
    #[serde(default)]
    pub path_style: bool,
}

/// What went wrong with a store, and whose it is to fix.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The settings or a location are wrong: fix the configuration (no retry helps).
    #[error("{0}")]
    Config(String),
    /// The store refused or failed a request (a retry may help).
    #[error("{0}")]
    External(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// `s3://bucket/prefix`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// The key prefix, no leading or trailing `/` (empty: the bucket's root).
    pub prefix: String,
}

impl S3Url {
    /// Whether a configured location is an `s3://` URL (else a local path).
    pub fn is_s3(location: &str) -> bool {
        location.starts_with("s3://")
    }

    /// Parses `s3://bucket[/prefix]`; the error says what is wrong with it.
    pub fn parse(location: &str) -> Result<S3Url> {
        let rest = location.strip_prefix("s3://").ok_or_else(|| {
            StoreError::Config(format!(
                "{location:?} is not an s3://bucket/prefix location"
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !valid_bucket {
            return Err(StoreError::Config(format!(
                "{location:?}: bucket {bucket:?} must be 3 to 63 lowercase letters, digits, `-` and `.`"
            )));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            && !prefix.is_empty()
        {
            return Err(StoreError::Config(format!(
                "{location:?}: the prefix has an empty, `.` or `..` part"
            )));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

impl S3Settings {
    /// Checks what can be checked without the store; the error names the option.
    pub fn check(&self, place: &str) -> Result<()> {
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Err(StoreError::Config(format!(
                "{place}: `s3.access_key_id` and `s3.secret_access_key` go together: set both, \
                 or neither to take AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment"
            )));
        }
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(StoreError::Config(format!(
                "{place}: `s3.endpoint` {endpoint:?} must start with http:// or https://"
            )));
        }
        Ok(())
    }
}

/// Whether a conditional put created its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    Yes,
    /// An object of that name was there: nothing was written.
    AlreadyThere,
}

/// One bucket of an S3 store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct S3Store {
    store: Arc<AmazonS3>,
    bucket: String,
}

impl S3Store {
    /// The client of `bucket` with `settings` (the environment filling what they leave
    /// out). Connects nothing yet: the first request does.
    pub fn connect(bucket: &str, settings: &S3Settings) -> Result<S3Store> {
        settings.check("s3")?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(Duration::from_secs(5));
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
            options = options.with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(region) = &settings.region {
            builder = builder.with_region(region);
        }
        if let (Some(id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        let store = builder
            .with_virtual_hosted_style_request(!settings.path_style)
            .with_client_options(options)
            .with_retry(RetryConfig {
                retry_timeout: RETRY_TIMEOUT,
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| StoreError::Config(format!("s3 settings of bucket {bucket}: {e}")))?;
        Ok(S3Store {
            store: Arc::new(store),
            bucket: bucket.to_string(),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The client, for streaming writes and ranged reads.
    pub fn inner(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// `s3://<bucket>/<key>`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// The key of `url` (`s3://<bucket>/<key>`); an error when it is not in this bucket.
    pub fn key<'a>(&self, url: &'a str) -> Result<&'a str> {
        url.strip_prefix("s3://")
            .and_then(|rest| rest.strip_prefix(self.bucket.as_str()))
            .and_then(|rest| rest.strip_prefix('/'))
            .ok_or_else(|| {
                StoreError::Config(format!("{url} is not in bucket s3://{}", self.bucket))
            })
    }

    /// `key` as the client's path (an error for empty, `.` or `..` parts).
    pub fn path(&self, key: &str) -> Result<Path> {
        Path::parse(key).map_err(|e| StoreError::Config(format!("{}: {e}", self.url(key))))
    }

    fn failed(&self, what: &str, key: &str, e: object_store::Error) -> StoreError {
        StoreError::External(format!("cannot {what} {}: {e}", self.url(key)))
    }

    /// Every object's key under `prefix/` (the whole bucket for an empty prefix), sorted.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let path = self.path(prefix)?;
        // A plain loop, not `map_ok(..).try_collect()`: that closure's future is not
        // `Send` for every lifetime, which `async_trait` callers need.
        let mut listed = self.store.list(Some(&path));
        let mut keys = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| self.failed("list", prefix, e))?;
            keys.push(meta.location.to_string());
        }
        keys.sort();
        Ok(keys)
    }

    /// Writes `bytes` at `key` unless an object is there (`If-None-Match: *`): returns
    /// only once the object is durable, or was there before.
    pub async fn put_new(&self, key: &str, bytes: Bytes) -> Result<Created> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match (self.store)
            .put_opts(&self.path(key)?, PutPayload::from_bytes(bytes), options)
            .await
        {
            Ok(_) => Ok(Created::Yes),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::AlreadyThere),
            Err(e) => Err(self.failed("write", key, e)),
        }
    }

    /// The object at `key` (`None`: there is none).
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let got = match self.store.get(&self.path(key)?).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.failed("read", key, e)),
        };
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| self.failed("read", key, e))
    }

    /// Removes the objects at `keys` (those already gone are no error).
    pub async fn delete(&self, keys: &[String]) -> Result<()> {
        let paths: Vec<Path> = keys.iter().map(|k| self.path(k)).collect::<Result<_>>()?;
        let mut removed = self
            .store
            .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed());
        while let Some(result) = removed.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(StoreError::External(format!("cannot remove: {e}"))),
            }
        }
        Ok(())
    }

    /// Removes every object under `prefix/`; how many there were.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<usize> {
        let keys = self.list(prefix).await?;
        self.delete(&keys).await?;
        Ok(keys.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn s3_urls_split_into_bucket_and_prefix() {
        let u = S3Url::parse("s3://my-bucket/a/b/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("my-bucket", "a/b"));
        assert_eq!(u.to_string(), "s3://my-bucket/a/b");
        let root = S3Url::parse("s3://bkt").unwrap();
        assert_eq!(root.prefix, "");
        assert_eq!(root.to_string(), "s3://bkt");
        assert!(S3Url::is_s3("s3://bkt") && !S3Url::is_s3("/var/out"));
        for bad in [
            "/tmp/wh",
            "s3://",
            "s3://B/x",
            "s3://ab/x",
            "s3://bkt/a//b",
            "s3://bkt/../x",
        ] {
            assert!(
                matches!(S3Url::parse(bad), Err(StoreError::Config(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn settings_errors_name_the_option() {
        let half = S3Settings {
            access_key_id: Some("id".into()),
            ..S3Settings::default()
        };
        let e = half.check("iceberg endpoint").unwrap_err().to_string();
        assert!(
            e.contains("s3.secret_access_key") && e.contains("iceberg endpoint"),
            "{e}"
        );
        let bad = S3Settings {
            endpoint: Some("127.0.0.1:9000".into()),
            ..S3Settings::default()
        };
        assert!(
            bad.check("x")
                .unwrap_err()
                .to_string()
                .contains("s3.endpoint")
        );
        let parsed: S3Settings = serde_json::from_value(
            json!({"endpoint": "http://127.0.0.1:9000", "path_style": true}),
        )
        .unwrap();
        assert!(parsed.path_style && parsed.check("x").is_ok());
        assert!(serde_json::from_value::<S3Settings>(json!({"endpoint_url": "x"})).is_err());
    }

    #[test]
    fn keys_and_urls_round_trip_within_the_bucket() {
        let store = S3Store::connect(
            "bkt",
            &S3Settings {
                endpoint: Some("http://127.0.0.1:1".into()),
                region: Some("us-east-1".into()),
                access_key_id: Some("a".into()),
                secret_access_key: Some("b".into()),
                path_style: true,
            },
        )
        .unwrap();
        assert_eq!(store.url("a/b.json"), "s3://bkt/a/b.json");
        assert_eq!(store.key("s3://bkt/a/b.json").unwrap(), "a/b.json");
        assert!(store.key("s3://other/a").is_err());
        assert!(store.key("s3://bktx/a").is_err());
        assert!(store.path("a//b").is_err());
    }
}
