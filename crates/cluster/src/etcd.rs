//! A small etcd v3 client over our own `proto/etcd.proto`: the key, lease and watch
//! calls the cluster makes, each bounded by a timeout (a watch's only until etcd
//! answers; its stream then lasts until it fails), over one lazily connected channel
//! that reconnects by itself (an etcd restart costs the calls made while it is down,
//! and ends the watches open then: their holder watches again). Over
//! TLS (`cluster.tls`: the CA, and a client certificate for etcd's
//! `--client-cert-auth`) the connection is ours (rustls, the issuer named when a
//! certificate does not verify), and tonic frames gRPC over it.

use futures::StreamExt;
use hyper_util::rt::TokioIo;
use sluice_tls::rustls::ClientConfig;
use sluice_tls::rustls::pki_types::ServerName;
use sluice_tls::{TlsConnector, handshake_failure};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

#[allow(clippy::all, clippy::pedantic)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

pub use pb::KeyValue;
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::request_op::Request;
use pb::response_op::Response;
use pb::watch_client::WatchClient;

/// A call to etcd that failed: which call, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("etcd {call}: {reason}")]
pub struct EtcdError {
    pub call: &'static str,
    pub reason: String,
    /// etcd refused the call because the lease it names has expired (or was revoked):
    /// whoever wrote with that lease has lost it.
    pub lease_gone: bool,
}

impl EtcdError {
    pub fn new(call: &'static str, reason: impl Into<String>) -> EtcdError {
        EtcdError {
            call,
            reason: reason.into(),
            lease_gone: false,
        }
    }
}

/// What etcd answers a write or renewal naming a lease it no longer has
/// (`rpctypes.ErrGRPCLeaseNotFound`).
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

fn failed(call: &'static str) -> impl FnOnce(tonic::Status) -> EtcdError {
    move |status| EtcdError {
        call,
        lease_gone: status.code() == tonic::Code::NotFound && status.message() == LEASE_NOT_FOUND,
        reason: match status.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown => {
                format!("unreachable ({})", with_causes(&status))
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => "timed out".to_string(),
            code => format!("{code:?}: {}", status.message()),
        },
    }
}

/// The status's message and the errors under it: a connection's failure (a TLS
/// certificate that does not verify, say) is only there.
fn with_causes(status: &tonic::Status) -> String {
    let mut text = status.message().to_string();
    let mut cause = std::error::Error::source(status);
    while let Some(err) = cause {
        let said = err.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = err.source();
    }
    text
}

/// One condition of a transaction.
#[derive(Debug, Clone)]
pub enum Cond {
    /// The key's last write was at this revision (0: the key is absent).
    ModRevision(String, i64),
    /// The key was never written since it was last deleted.
    Absent(String),
    /// The key holds exactly these bytes.
    Value(String, Vec<u8>),
    /// No key exists under this prefix.
    NoneUnder(String),
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        /// Deleted with this lease; 0: kept.
        lease: i64,
    },
    Delete(String),
    /// Every key under this prefix.
    DeletePrefix(String),
    Get(String),
}

/// What a transaction did.
#[derive(Debug)]
pub struct TxnOutcome {
    pub succeeded: bool,
    /// The store's revision after it: the revision of every key it wrote.
    pub revision: i64,
    /// Keys read by its `Get` operations, in order.
    pub got: Vec<Option<KeyValue>>,
}

#[derive(Clone)]
pub struct Etcd {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
}

fn bad_endpoint(url: &str, why: impl std::fmt::Display) -> EtcdError {
    EtcdError::new("connect", format!("{url:?} is not an endpoint URL: {why}"))
}

/// Plain HTTP/2 to every endpoint, balanced by tonic.
fn plain_channel(endpoints: &[String], timeout: Duration) -> Result<Channel, EtcdError> {
    let mut list = Vec::new();
    for url in endpoints {
        if url.starts_with("https://") {
            return Err(bad_endpoint(
                url,
                "an https:// endpoint needs cluster.tls (at least its ca)",
            ));
        }
        let url = if url.contains("://") {
            url.clone()
        } else {
            format!("http://{url}")
        };
        let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| bad_endpoint(&url, e))?;
        list.push(
            endpoint
                .connect_timeout(timeout)
                .timeout(timeout)
                .tcp_nodelay(true),
        );
    }
    Ok(match list.len() {
        1 => list.pop().expect("one endpoint").connect_lazy(),
        _ => Channel::balance_list(list.into_iter()),
    })
}

/// TLS to the endpoints (`https://host:port` or `host:port`), the server's certificate
/// checked against `host`. One channel whose connector tries the endpoints in turn: a
/// connection that fails moves on to the next member, as the plain channel's balancing
/// does. HTTP/2 is negotiated by ALPN, as etcd's gRPC server requires.
fn tls_channel(
    endpoints: &[String],
    timeout: Duration,
    tls: &TlsConnector,
) -> Result<Channel, EtcdError> {
    let mut targets = Vec::new();
    for url in endpoints {
        if url.starts_with("http://") {
            return Err(bad_endpoint(url, "with cluster.tls, write https://"));
        }
        let authority = url.strip_prefix("https://").unwrap_or(url);
        let authority = authority.trim_end_matches('/');
        let (host, port) = authority
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
            .ok_or_else(|| bad_endpoint(url, "write https://host:port"))?;
        let name = ServerName::try_from(host.to_string()).map_err(|e| bad_endpoint(url, e))?;
        targets.push((host.to_string(), port, name));
    }
    let mut config = ClientConfig::clone(tls.config());
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let targets = Arc::new(targets);
    let next = Arc::new(AtomicUsize::new(0));
    let connect = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let (targets, next, connector) = (targets.clone(), next.clone(), connector.clone());
        async move {
            let at = next.fetch_add(1, Ordering::Relaxed) % targets.len();
            let (host, port, name) = &targets[at];
            let tcp = tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), *port)))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                })??;
            tcp.set_nodelay(true)?;
            let stream = connector.connect(name.clone(), tcp).await.map_err(|e| {
                let reason = handshake_failure(&e).unwrap_or_else(|| e.to_string());
                std::io::Error::new(e.kind(), format!("{host}:{port}: {reason}"))
            })?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    // The URI only frames the requests; the connector picks the member.
    let endpoint = Endpoint::from_static("http://etcd.cluster")
        .connect_timeout(timeout)
        .timeout(timeout);
    Ok(endpoint.connect_with_connector_lazy(connect))
}

/// The end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    /// A client of the cluster at `endpoints` (`http://host:2379`, or `https://` with
    /// `tls`). Connects lazily: an unreachable etcd shows in the first call, as an
    /// [`EtcdError`].
    pub fn connect(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<&TlsConnector>,
    ) -> Result<Etcd, EtcdError> {
        let channel = match tls {
            None => plain_channel(endpoints, timeout)?,
            Some(tls) => tls_channel(endpoints, timeout, tls)?,
        };
        Ok(Etcd {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel),
        })
    }

    /// The key `key`, if present.
    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let response = (self.kv.clone())
            .range(pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .map_err(failed("get"))?;
        Ok(response.into_inner().kvs.pop())
    }

    /// Every key under `prefix`, in key order, and the revision they were read at.
    pub async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let response = (self.kv.clone())
            .range(pb::RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix),
                ..Default::default()
            })
            .await
            .map_err(failed("get"))?
            .into_inner();
        let revision = response.header.map_or(0, |h| h.revision);
        Ok((response.kvs, revision))
    }

    pub async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<i64, EtcdError> {
        let response = (self.kv.clone())
            .put(pb::PutRequest {
                key: key.as_bytes().to_vec(),
                value,
                lease,
            })
            .await
            .map_err(failed("put"))?;
        Ok(response.into_inner().header.map_or(0, |h| h.revision))
    }

    /// Applies `then` if every condition of `when` holds, else `otherwise`, atomically.
    pub async fn txn(
        &self,
        when: Vec<Cond>,
        then: Vec<Op>,
        otherwise: Vec<Op>,
    ) -> Result<TxnOutcome, EtcdError> {
        let compare = when
            .into_iter()
            .map(|cond| match cond {
                Cond::ModRevision(key, revision) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.into_bytes(),
                    target_union: Some(TargetUnion::ModRevision(revision)),
                    range_end: Vec::new(),
                },
                Cond::Absent(key) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.into_bytes(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                    range_end: Vec::new(),
                },
                Cond::Value(key, value) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Value as i32,
                    key: key.into_bytes(),
                    target_union: Some(TargetUnion::Value(value)),
                    range_end: Vec::new(),
                },
                // etcd compares every key of the range, and an empty range as one key
                // never created: so "created at revision 0" holds only when none exists.
                Cond::NoneUnder(prefix) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    range_end: prefix_end(&prefix),
                    key: prefix.into_bytes(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                },
            })
            .collect();
        let ops = |ops: Vec<Op>| -> Vec<pb::RequestOp> {
            ops.into_iter()
                .map(|op| pb::RequestOp {
                    request: Some(match op {
                        Op::Put { key, value, lease } => Request::RequestPut(pb::PutRequest {
                            key: key.into_bytes(),
                            value,
                            lease,
                        }),
                        Op::Delete(key) => Request::RequestDeleteRange(pb::DeleteRangeRequest {
                            key: key.into_bytes(),
                            range_end: Vec::new(),
                        }),
                        Op::DeletePrefix(prefix) => {
                            Request::RequestDeleteRange(pb::DeleteRangeRequest {
                                range_end: prefix_end(&prefix),
                                key: prefix.into_bytes(),
                            })
                        }
                        Op::Get(key) => Request::RequestRange(pb::RangeRequest {
                            key: key.into_bytes(),
                            ..Default::default()
                        }),
                    }),
                })
                .collect()
        };
        let response = (self.kv.clone())
            .txn(pb::TxnRequest {
                compare,
                success: ops(then),
                failure: ops(otherwise),
            })
            .await
            .map_err(failed("txn"))?
            .into_inner();
        let got = response
            .responses
            .into_iter()
            .filter_map(|r| match r.response {
                Some(Response::ResponseRange(mut range)) => Some(range.kvs.pop()),
                _ => None,
            })
            .collect();
        Ok(TxnOutcome {
            succeeded: response.succeeded,
            revision: response.header.map_or(0, |h| h.revision),
            got,
        })
    }

    /// A new lease of `ttl`; returns its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let response = (self.lease.clone())
            .lease_grant(pb::LeaseGrantRequest {
                ttl: ttl.as_secs().max(1) as i64,
                id: 0,
            })
            .await
            .map_err(failed("lease grant"))?
            .into_inner();
        if !response.error.is_empty() {
            return Err(EtcdError::new("lease grant", response.error));
        }
        Ok(response.id)
    }

    /// Renews lease `id`; returns its time to live, `None` once it has expired.
    pub async fn keep_alive(&self, id: i64) -> Result<Option<Duration>, EtcdError> {
        let request = futures::stream::once(async move { pb::LeaseKeepAliveRequest { id } });
        let mut answers = (self.lease.clone())
            .lease_keep_alive(request)
            .await
            .map_err(failed("lease keep-alive"))?
            .into_inner();
        match answers.next().await {
            Some(Ok(answer)) if answer.ttl > 0 => Ok(Some(Duration::from_secs(answer.ttl as u64))),
            Some(Ok(_)) => Ok(None),
            Some(Err(status)) => Err(failed("lease keep-alive")(status)),
            None => Err(EtcdError::new(
                "lease keep-alive",
                "the stream ended without an answer",
            )),
        }
    }

    /// Watches every key under each of `prefixes` from now on. Returns once etcd has
    /// created every watch; the stream then yields, for each change etcd reports, the
    /// revision it was made at, and ends with an error when the watch ends (etcd
    /// stopped or cancelled it): a caller that keeps watching calls again, and looks
    /// at the keys again for what changed in between.
    pub async fn watch(
        &self,
        prefixes: &[String],
    ) -> Result<impl futures::Stream<Item = Result<i64, EtcdError>> + Send + use<>, EtcdError> {
        let creates: Vec<pb::WatchRequest> = (prefixes.iter())
            .map(|prefix| pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                    pb::WatchCreateRequest {
                        key: prefix.as_bytes().to_vec(),
                        range_end: prefix_end(prefix),
                        start_revision: 0,
                    },
                )),
            })
            .collect();
        // The request stream stays open: a closed one may end the watches with it.
        let requests = futures::stream::iter(creates).chain(futures::stream::pending());
        let mut answers = (self.watch.clone())
            .watch(requests)
            .await
            .map_err(failed("watch"))?
            .into_inner();
        let ended = |reason: String| EtcdError::new("watch", reason);
        let mut created = 0;
        while created < prefixes.len() {
            match answers.next().await {
                Some(Ok(answer)) if answer.canceled => {
                    return Err(ended(format!("refused: {}", answer.cancel_reason)));
                }
                Some(Ok(answer)) => created += usize::from(answer.created),
                Some(Err(status)) => return Err(failed("watch")(status)),
                None => return Err(ended("the stream ended before the watch began".into())),
            }
        }
        Ok(futures::stream::unfold(
            Some(answers),
            move |answers| async move {
                let mut answers = answers?;
                loop {
                    let next = match answers.next().await {
                        Some(Ok(answer)) if answer.canceled => Err(ended(format!(
                            "etcd cancelled it: {} (compacted at revision {})",
                            answer.cancel_reason, answer.compact_revision
                        ))),
                        Some(Ok(answer)) if answer.events.is_empty() => continue,
                        Some(Ok(answer)) => Ok(answer.header.map_or(0, |h| h.revision)),
                        Some(Err(status)) => Err(failed("watch")(status)),
                        None => Err(ended("the stream ended".into())),
                    };
                    let more = next.is_ok().then_some(answers);
                    return Some((next, more));
                }
            },
        ))
    }

    /// Ends lease `id` now: every key written with it is deleted.
    pub async fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        (self.lease.clone())
            .lease_revoke(pb::LeaseRevokeRequest { id })
            .await
            .map_err(failed("lease revoke"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
