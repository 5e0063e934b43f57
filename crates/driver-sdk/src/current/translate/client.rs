//! A Transactions stream, the runtime's side: the runtime's seed requests to a current
//! connector, its responses back to seed ones ([`ClientTranslator`]).

use super::*;

/// Where the connector's Acknowledged of the current transaction is.
#[derive(Debug, Clone, PartialEq)]
enum DriverAck {
    Pending,
    /// Arrived before the runtime's Acknowledge: handed back with it.
    Held(TransactionResponse),
    /// Handed to the runtime.
    Released,
}

/// The client side's phase; the runtime checkpoint of Prepare is held from Flush to
/// StartCommit.
#[derive(Debug, Clone, PartialEq)]
enum ClientPhase {
    AwaitingOpen,
    Opening,
    Loading {
        runtime_acked: bool,
        driver: DriverAck,
    },
    Flushing {
        checkpoint: Vec<u8>,
    },
    Storing {
        checkpoint: Vec<u8>,
    },
    Committing,
    /// A violation ended the stream.
    Failed,
}

/// The runtime side: the runtime's seed requests to a current connector, and its
/// current responses back to seed ones. See the module docs.
#[derive(Debug)]
pub struct ClientTranslator {
    phase: ClientPhase,
}

impl Default for ClientTranslator {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientTranslator {
    pub fn new() -> Self {
        ClientTranslator {
            phase: ClientPhase::AwaitingOpen,
        }
    }

    /// The runtime sends `req`.
    pub fn request(
        &mut self,
        req: TransactionRequest,
    ) -> Result<Translated<cm::Request, TransactionResponse>, ProtocolError> {
        let commit_checkpoint = req.commit.as_ref().map(|c| c.flow_checkpoint.clone());
        let req = crate::machine::Request::try_from(req)?;
        let phase = std::mem::replace(&mut self.phase, ClientPhase::Failed);
        let (phase, translated) = Self::on_request(phase, req, commit_checkpoint)?;
        self.phase = phase;
        Ok(translated)
    }

    fn on_request(
        phase: ClientPhase,
        req: crate::machine::Request,
        commit_checkpoint: Option<Vec<u8>>,
    ) -> Result<(ClientPhase, Translated<cm::Request, TransactionResponse>), ProtocolError> {
        use crate::machine::Request as R;
        let got = req.name();
        Ok(match (phase, req) {
            (ClientPhase::AwaitingOpen, R::Open(open)) => {
                let open = cm::request::Open {
                    materialization: open.materialization.map(spec_to_current),
                    version: open.version,
                    range: Some(cf::RangeSpec {
                        key_begin: open.key_begin,
                        key_end: open.key_end,
                        r_clock_begin: 0,
                        r_clock_end: u32::MAX,
                    }),
                    state_json: state_or_empty(open.driver_checkpoint_json),
                };
                let out = request_of(|r| r.open = Some(open));
                (ClientPhase::Opening, Translated::one(out))
            }
            (
                ClientPhase::Loading {
                    runtime_acked: false,
                    driver,
                },
                R::Acknowledge,
            ) => {
                let out = request_of(|r| r.acknowledge = Some(cm::request::Acknowledge {}));
                let (driver, back) = match driver {
                    DriverAck::Held(acked) => (DriverAck::Released, vec![acked]),
                    other => (other, Vec::new()),
                };
                let phase = ClientPhase::Loading {
                    runtime_acked: true,
                    driver,
                };
                (
                    phase,
                    Translated {
                        out: vec![out],
                        back,
                    },
                )
            }
            (phase @ (ClientPhase::Loading { .. } | ClientPhase::Committing), R::Load(load)) => {
                (phase, Translated::out(loads(&load)?))
            }
            (
                ClientPhase::Loading {
                    driver: DriverAck::Released,
                    ..
                },
                R::Prepare(prepare),
            ) => {
                let out = request_of(|r| r.flush = Some(cm::request::Flush {}));
                let phase = ClientPhase::Flushing {
                    checkpoint: prepare.flow_checkpoint,
                };
                (phase, Translated::one(out))
            }
            (ClientPhase::Storing { checkpoint }, R::Store(store)) => (
                ClientPhase::Storing { checkpoint },
                Translated::out(stores(&store)?),
            ),
            (ClientPhase::Storing { checkpoint }, R::Commit) => {
                // Commit's own checkpoint, when it carries one, replaces Prepare's.
                let checkpoint = commit_checkpoint
                    .filter(|c| !c.is_empty())
                    .unwrap_or(checkpoint);
                let out = request_of(|r| {
                    r.start_commit = Some(cm::request::StartCommit {
                        runtime_checkpoint: Some(wrap_checkpoint(checkpoint)),
                    })
                });
                (ClientPhase::Committing, Translated::one(out))
            }
            (phase, _) => {
                let expected = match phase {
                    ClientPhase::AwaitingOpen => "Open",
                    ClientPhase::Opening => "no request before Opened",
                    ClientPhase::Loading {
                        runtime_acked: false,
                        ..
                    } => "Acknowledge or Load",
                    ClientPhase::Loading {
                        driver: DriverAck::Released,
                        ..
                    } => "Load or Prepare",
                    ClientPhase::Loading { .. } => "Load, or Prepare once Acknowledged has arrived",
                    ClientPhase::Flushing { .. } => "no request before Prepared",
                    ClientPhase::Storing { .. } => "Store or Commit",
                    ClientPhase::Committing => "no request but Load before DriverCommitted",
                    ClientPhase::Failed => "no request after a violation",
                };
                return Err(violation(Peer::Runtime, expected, got));
            }
        })
    }

    /// The connector sends `resp`.
    pub fn response(
        &mut self,
        resp: cm::Response,
    ) -> Result<Vec<TransactionResponse>, ProtocolError> {
        let resp = Resp::of(resp)?;
        let phase = std::mem::replace(&mut self.phase, ClientPhase::Failed);
        let (phase, out) = Self::on_response(phase, resp)?;
        self.phase = phase;
        Ok(out)
    }

    fn on_response(
        phase: ClientPhase,
        resp: Resp,
    ) -> Result<(ClientPhase, Vec<TransactionResponse>), ProtocolError> {
        let seed = |r: crate::machine::Response| -> TransactionResponse { r.into() };
        Ok(match (phase, resp) {
            (ClientPhase::Opening, Resp::Opened(opened)) => {
                let flow_checkpoint = unwrap_checkpoint(opened.runtime_checkpoint)?;
                let out = seed(crate::machine::Response::Opened(rs::Opened {
                    flow_checkpoint,
                }));
                let phase = ClientPhase::Loading {
                    runtime_acked: false,
                    driver: DriverAck::Pending,
                };
                (phase, vec![out])
            }
            (
                ClientPhase::Loading {
                    runtime_acked,
                    driver: DriverAck::Pending,
                },
                Resp::Acknowledged(acked),
            ) => {
                let out = TransactionResponse {
                    acknowledged: Some(rs::Acknowledged {
                        driver_checkpoint: acked.state.map(|s| driver_checkpoint_of(Some(s))),
                    }),
                    ..Default::default()
                };
                if runtime_acked {
                    let phase = ClientPhase::Loading {
                        runtime_acked,
                        driver: DriverAck::Released,
                    };
                    (phase, vec![out])
                } else {
                    let phase = ClientPhase::Loading {
                        runtime_acked,
                        driver: DriverAck::Held(out),
                    };
                    (phase, Vec::new())
                }
            }
            (
                phase @ (ClientPhase::Loading { .. } | ClientPhase::Flushing { .. }),
                Resp::Loaded(loaded),
            ) => {
                let doc = loaded.doc_json;
                let out = seed(crate::machine::Response::Loaded(rs::Loaded {
                    binding: loaded.binding,
                    docs_json: vec![Slice {
                        begin: 0,
                        end: doc.len() as u32,
                    }],
                    arena: doc,
                }));
                (phase, vec![out])
            }
            (ClientPhase::Flushing { checkpoint }, Resp::Flushed(flushed)) => {
                let out = seed(crate::machine::Response::Prepared(driver_checkpoint_of(
                    flushed.state,
                )));
                (ClientPhase::Storing { checkpoint }, vec![out])
            }
            (ClientPhase::Committing, Resp::StartedCommit(started)) => {
                let out = TransactionResponse {
                    driver_committed: Some(rs::DriverCommitted {
                        driver_checkpoint: started.state.map(|s| driver_checkpoint_of(Some(s))),
                    }),
                    ..Default::default()
                };
                let phase = ClientPhase::Loading {
                    runtime_acked: false,
                    driver: DriverAck::Pending,
                };
                (phase, vec![out])
            }
            (phase, resp) => {
                let got = resp.name();
                let (expected, got) = match (&phase, &resp) {
                    (ClientPhase::Loading { .. }, Resp::Acknowledged(_))
                    | (
                        ClientPhase::Flushing { .. } | ClientPhase::Storing { .. },
                        Resp::Acknowledged(_),
                    ) => (
                        "one Acknowledged per transaction",
                        "a second Acknowledged before StartedCommit".to_string(),
                    ),
                    (ClientPhase::Committing, Resp::Acknowledged(_)) => (
                        "StartedCommit before the next transaction's Acknowledged",
                        "Acknowledged before StartedCommit".to_string(),
                    ),
                    (ClientPhase::AwaitingOpen, _) => ("no response before Open", got.into()),
                    (ClientPhase::Opening, _) => ("Opened", got.into()),
                    (ClientPhase::Loading { .. }, _) => ("Acknowledged or Loaded", got.into()),
                    (ClientPhase::Flushing { .. }, _) => ("Loaded or Flushed", got.into()),
                    (ClientPhase::Storing { .. }, _) => {
                        ("no response before StartCommit", got.into())
                    }
                    (ClientPhase::Committing, _) => ("StartedCommit", got.into()),
                    (ClientPhase::Failed, _) => ("no response after a violation", got.into()),
                };
                return Err(violation(Peer::Driver, expected, got));
            }
        })
    }
}

/// A seed arena message that cannot be read (a slice outside its arena, a key that is
/// not a packed tuple) is the runtime's violation.
fn unreadable(what: &str, err: impl std::fmt::Display) -> ProtocolError {
    violation(
        Peer::Runtime,
        format!("a readable {what}"),
        format!("a {what} that cannot be read: {err}"),
    )
}

/// A packed tuple as the JSON array the current protocol carries beside it.
fn tuple_json(what: &str, packed: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    let value = sluice_doc::tuple::unpack_json_array(packed).map_err(|e| unreadable(what, e))?;
    Ok(value.to_string().into_bytes())
}

/// One current Load per key of a seed Load.
fn loads(load: &rq::Load) -> Result<Vec<cm::Request>, ProtocolError> {
    arena::load_keys(load)
        .map(|key| {
            let key = key.map_err(|e| unreadable("Load", e))?;
            let load = cm::request::Load {
                binding: load.binding,
                key_json: tuple_json("Load", key)?,
                key_packed: key.to_vec(),
            };
            Ok(request_of(|r| r.load = Some(load)))
        })
        .collect()
}

/// One current Store per document of a seed Store; a `null` document is a deletion.
fn stores(store: &rq::Store) -> Result<Vec<cm::Request>, ProtocolError> {
    arena::store_docs(store)
        .map(|doc| {
            let doc = doc.map_err(|e| unreadable("Store", e))?;
            let store = cm::request::Store {
                binding: store.binding,
                key_json: tuple_json("Store", doc.key)?,
                key_packed: doc.key.to_vec(),
                values_json: tuple_json("Store", doc.values)?,
                values_packed: doc.values.to_vec(),
                doc_json: doc.doc.to_vec(),
                exists: doc.exists,
                delete: doc.doc.trim_ascii() == b"null",
            };
            Ok(request_of(|r| r.store = Some(store)))
        })
        .collect()
}
