//! A Transactions stream, the driver's side: a current runtime's requests to the seed
//! serve loop, checked in the current order, and its responses back
//! ([`ServerTranslator`]).

use super::*;

/// The server side's phase, as the current runtime's requests and the serve loop's
/// responses move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerPhase {
    AwaitingOpen,
    Opening,
    /// `acknowledge`: Acknowledge received; `acknowledged`: Acknowledged sent.
    Loading {
        acknowledge: bool,
        acknowledged: bool,
    },
    Flushing,
    Storing,
    Committing,
    Failed,
}

/// The driver side: a current runtime's requests to Sluice's seed serve loop, and the
/// serve loop's seed responses back to current ones. See the module docs.
///
/// Loads and Stores, one key or document each in the current protocol, are packed into
/// seed arena messages (one per binding, cut at [`arena::MAX_MESSAGE_BYTES`]), so a
/// Sluice driver loads and stores in batches as over the seed protocol, rather than a
/// store round trip per key. A batch goes on when it is full, and before any other
/// request: Flush and StartCommit, which the runtime awaits an answer to, always send
/// what was held first. The runtime never awaits a Load's answer on its own (Flow's
/// protocol: it "does not await any individual Load"), so holding Loads cannot stall it.
pub struct ServerTranslator {
    phase: ServerPhase,
    loads: arena::LoadBuilder,
    stores: arena::StoreBuilder,
}

impl std::fmt::Debug for ServerTranslator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTranslator")
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Default for ServerTranslator {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerTranslator {
    pub fn new() -> Self {
        ServerTranslator {
            phase: ServerPhase::AwaitingOpen,
            loads: arena::LoadBuilder::new(),
            stores: arena::StoreBuilder::new(),
        }
    }

    /// The current runtime sends `req`.
    pub fn request(
        &mut self,
        req: cm::Request,
    ) -> Result<Translated<TransactionRequest, cm::Response>, ProtocolError> {
        use crate::machine::Request as R;
        let req = Req::of(req)?;
        let got = req.name();
        let (phase, out) = match (self.phase, req) {
            (ServerPhase::AwaitingOpen, Req::Open(open)) => {
                let range = open.range.unwrap_or_default();
                let out = R::Open(rq::Open {
                    materialization: open.materialization.map(spec_from_current),
                    version: open.version,
                    key_begin: range.key_begin,
                    key_end: range.key_end,
                    driver_checkpoint_json: open.state_json,
                });
                (ServerPhase::Opening, vec![seed_request(out)])
            }
            (
                ServerPhase::Loading {
                    acknowledge: false,
                    acknowledged,
                },
                Req::Acknowledge,
            ) => {
                let phase = ServerPhase::Loading {
                    acknowledge: true,
                    acknowledged,
                };
                (phase, vec![seed_request(R::Acknowledge)])
            }
            (ServerPhase::Loading { .. } | ServerPhase::Committing, Req::Load(load)) => {
                self.loads.push(load.binding, &load.key_packed);
                let full = self.loads.take_ready().into_iter().map(R::Load);
                return Ok(Translated::out(full.map(seed_request).collect()));
            }
            (
                ServerPhase::Loading {
                    acknowledged: true, ..
                },
                Req::Flush,
            ) => {
                // The current protocol gives the runtime checkpoint only at StartCommit.
                let out = R::Prepare(rq::Prepare {
                    flow_checkpoint: Vec::new(),
                });
                (ServerPhase::Flushing, vec![seed_request(out)])
            }
            (ServerPhase::Storing, Req::Store(store)) => {
                let doc: &[u8] = if store.delete {
                    b"null"
                } else {
                    &store.doc_json
                };
                let doc = arena::StoreDoc {
                    key: &store.key_packed,
                    values: &store.values_packed,
                    doc,
                    exists: store.exists,
                };
                self.stores.push(store.binding, doc);
                let full = self.stores.take_ready().into_iter().map(R::Store);
                return Ok(Translated::out(full.map(seed_request).collect()));
            }
            (ServerPhase::Storing, Req::StartCommit(start)) => {
                let flow_checkpoint = start
                    .runtime_checkpoint
                    .map(|cp| cp.encode_to_vec())
                    .unwrap_or_default();
                let out = TransactionRequest {
                    commit: Some(rq::Commit { flow_checkpoint }),
                    ..Default::default()
                };
                (ServerPhase::Committing, vec![out])
            }
            (phase, _) => {
                let expected = match phase {
                    ServerPhase::AwaitingOpen => "Open",
                    ServerPhase::Opening => "no request before Opened",
                    ServerPhase::Loading {
                        acknowledge: false, ..
                    } => "Acknowledge or Load",
                    ServerPhase::Loading {
                        acknowledged: false,
                        ..
                    } => "Load, or Flush once Acknowledged was sent",
                    ServerPhase::Loading { .. } => "Load or Flush",
                    ServerPhase::Flushing => "no request before Flushed",
                    ServerPhase::Storing => "Store or StartCommit",
                    ServerPhase::Committing => "no request but Load before StartedCommit",
                    ServerPhase::Failed => "no request after a violation",
                };
                self.phase = ServerPhase::Failed;
                return Err(violation(Peer::Runtime, expected, got));
            }
        };
        self.phase = phase;
        // What was held goes first, in the order it came.
        let held = (self.loads.finish().into_iter().map(R::Load))
            .chain(self.stores.finish().into_iter().map(R::Store))
            .map(seed_request);
        Ok(Translated::out(held.chain(out).collect()))
    }

    /// The serve loop sends `resp`.
    pub fn response(
        &mut self,
        resp: TransactionResponse,
    ) -> Result<Vec<cm::Response>, ProtocolError> {
        let driver_checkpoint = |r: &TransactionResponse| {
            (r.driver_committed
                .as_ref()
                .and_then(|c| c.driver_checkpoint.clone()))
            .or_else(|| {
                r.acknowledged
                    .as_ref()
                    .and_then(|a| a.driver_checkpoint.clone())
            })
        };
        let carried = driver_checkpoint(&resp);
        let resp = crate::machine::Response::try_from(resp)?;
        use crate::machine::Response as S;
        let got = resp.name();
        let (phase, out) = match (self.phase, resp) {
            (ServerPhase::Opening, S::Opened(opened)) => {
                let runtime_checkpoint = if opened.flow_checkpoint.is_empty() {
                    None
                } else {
                    let cp = consumer::Checkpoint::decode(opened.flow_checkpoint.as_slice())
                        .map_err(|e| {
                            violation(
                                Peer::Driver,
                                "Opened with an encoded consumer.Checkpoint, as StartCommit gave it",
                                format!("Opened with a checkpoint that is not one ({e})"),
                            )
                        })?;
                    Some(cp)
                };
                let out = response_of(|r| {
                    r.opened = Some(cm::response::Opened {
                        runtime_checkpoint,
                        disable_load_optimization: false,
                    })
                });
                let phase = ServerPhase::Loading {
                    acknowledge: false,
                    acknowledged: false,
                };
                (phase, vec![out])
            }
            (
                ServerPhase::Loading {
                    acknowledge: true,
                    acknowledged: false,
                },
                S::Acknowledged(_),
            ) => {
                let out = response_of(|r| {
                    r.acknowledged = Some(cm::response::Acknowledged {
                        state: carried.and_then(state_of),
                    })
                });
                let phase = ServerPhase::Loading {
                    acknowledge: true,
                    acknowledged: true,
                };
                (phase, vec![out])
            }
            (phase @ (ServerPhase::Loading { .. } | ServerPhase::Flushing), S::Loaded(loaded)) => {
                let out = arena::loaded_docs(&loaded)
                    .map(|doc| {
                        let doc = doc.map_err(|e| {
                            violation(Peer::Driver, "a readable Loaded", e.to_string())
                        })?;
                        Ok(response_of(|r| {
                            r.loaded = Some(cm::response::Loaded {
                                binding: loaded.binding,
                                doc_json: doc.to_vec(),
                            })
                        }))
                    })
                    .collect::<Result<Vec<_>, ProtocolError>>()?;
                (phase, out)
            }
            (ServerPhase::Flushing, S::Prepared(update)) => {
                let out = response_of(|r| {
                    r.flushed = Some(cm::response::Flushed {
                        state: state_of(update),
                    })
                });
                (ServerPhase::Storing, vec![out])
            }
            (ServerPhase::Committing, S::DriverCommitted(_)) => {
                let out = response_of(|r| {
                    r.started_commit = Some(cm::response::StartedCommit {
                        state: carried.and_then(state_of),
                    })
                });
                let phase = ServerPhase::Loading {
                    acknowledge: false,
                    acknowledged: false,
                };
                (phase, vec![out])
            }
            (phase, _) => {
                self.phase = ServerPhase::Failed;
                let expected = match phase {
                    ServerPhase::Opening => "Opened",
                    ServerPhase::Loading {
                        acknowledge: true,
                        acknowledged: false,
                    } => "Acknowledged or Loaded",
                    ServerPhase::Loading { .. } => "Loaded",
                    ServerPhase::Flushing => "Loaded or Prepared",
                    ServerPhase::Committing => "DriverCommitted",
                    _ => "no response",
                };
                return Err(violation(Peer::Driver, expected, got));
            }
        };
        self.phase = phase;
        Ok(out)
    }
}
