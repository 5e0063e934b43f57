//! A small etcd v3 client over our own `proto/etcd.proto`: the key and lease calls the
//! cluster makes, each bounded by a timeout, over one lazily connected channel that
//! reconnects by itself (an etcd restart costs the calls made while it is down).

use futures::StreamExt;
use std::time::Duration;
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

/// A call to etcd that failed: which call, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("etcd {call}: {reason}")]
pub struct EtcdError {
    pub call: &'static str,
    pub reason: String,
}

fn failed(call: &'static str) -> impl FnOnce(tonic::Status) -> EtcdError {
    move |status| EtcdError {
        call,
        reason: match status.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown => {
                format!("unreachable ({})", status.message())
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => "timed out".to_string(),
            code => format!("{code:?}: {}", status.message()),
        },
    }
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
    /// A client of the cluster at `endpoints` (`http://host:2379`). Connects lazily:
    /// an unreachable etcd shows in the first call, as an [`EtcdError`].
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Etcd, EtcdError> {
        let mut list = Vec::new();
        for url in endpoints {
            let url = if url.contains("://") {
                url.clone()
            } else {
                format!("http://{url}")
            };
            let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| EtcdError {
                call: "connect",
                reason: format!("{url:?} is not an endpoint URL: {e}"),
            })?;
            list.push(
                endpoint
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .tcp_nodelay(true),
            );
        }
        let channel = match list.len() {
            1 => list.pop().expect("one endpoint").connect_lazy(),
            _ => Channel::balance_list(list.into_iter()),
        };
        Ok(Etcd {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
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
                },
                Cond::Absent(key) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.into_bytes(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                },
                Cond::Value(key, value) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Value as i32,
                    key: key.into_bytes(),
                    target_union: Some(TargetUnion::Value(value)),
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
            return Err(EtcdError {
                call: "lease grant",
                reason: response.error,
            });
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
            None => Err(EtcdError {
                call: "lease keep-alive",
                reason: "the stream ended without an answer".into(),
            }),
        }
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
