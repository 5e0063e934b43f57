//! The driver side of the current protocol, whatever carries it, and [`relay`], the one
//! pump of a translated Transactions session on either side.
//!
//! ```text
//!  peer ──cm::Request──▶ serve_current ─┬─ Spec | Validate | Apply: one answer, then the end
//!                                       └─ Open: relay ──seed requests──▶ serve_transactions
//!  peer ◀─cm::Response──────────────────────── relay ◀──seed responses──┘
//! ```
//!
//! The session runs the seed's serve loop ([`serve_transactions`]) unchanged: the
//! translation is all the current protocol adds, so every guarantee of that loop (one
//! request at a time, nothing committed after an error) holds here too.

use super::translate::{self, ClientTranslator, ServerTranslator, Translated, Unary};
use crate::grpc::STREAM_BUFFER;
use crate::serve::serve_transactions;
use crate::{Driver, Error, ProtocolError, Result};
use futures::StreamExt;
use futures::stream::BoxStream;
use sluice_proto::current::materialize as cm;
use sluice_proto::materialize as m;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Serves one current-protocol stream of `driver`: `requests` from the peer, `responses`
/// to it. The first request decides: Spec, Validate and Apply are answered once, then
/// the stream ends; Open starts a Transactions session, which ends when the peer closes
/// its side between transactions. Any error ends the stream; the transport reports it.
pub async fn serve_current(
    driver: Arc<dyn Driver>,
    mut requests: BoxStream<'static, Result<cm::Request>>,
    responses: mpsc::Sender<cm::Response>,
) -> Result<()> {
    let Some(first) = requests.next().await.transpose()? else {
        return Ok(());
    };
    if first.open.is_none() {
        let response = answer(driver.as_ref(), first).await?;
        return send_peer_response(&responses, response).await;
    }
    let (seed_requests, seed_requests_rx) = mpsc::channel(STREAM_BUFFER);
    let (seed_responses, seed_responses_rx) = mpsc::channel(STREAM_BUFFER);
    let inbound = futures::stream::iter([Ok(first)]).chain(requests).boxed();
    let served = serve_transactions(
        driver,
        ReceiverStream::new(seed_requests_rx).map(Ok).boxed(),
        seed_responses,
    );
    let relayed = relay(
        ServerTranslator::new(),
        inbound,
        seed_requests,
        ReceiverStream::new(seed_responses_rx).map(Ok).boxed(),
        responses,
    );
    // The relay ends when the serve loop does (its responses end) and the serve loop
    // when the relay does (its requests end), so neither outlives the other. A
    // translation error is the cause of whatever the serve loop then reports.
    let (served, relayed) = futures::join!(served, relayed);
    relayed.and(served)
}

/// Answers a request other than Open, once.
async fn answer(driver: &dyn Driver, request: cm::Request) -> Result<cm::Response> {
    Ok(match translate::unary_request(request)? {
        Unary::Spec(req) => translate::spec_response(driver.spec(req).await?),
        Unary::Validate(req) => translate::validated_response(driver.validate(req).await?),
        Unary::Apply(req) => translate::applied_response(driver.apply_upsert(req).await?),
        Unary::ApplyDelete(req) => translate::applied_response(driver.apply_delete(req).await?),
    })
}

async fn send_peer_response(
    responses: &mpsc::Sender<cm::Response>,
    response: cm::Response,
) -> Result<()> {
    responses
        .send(response)
        .await
        .map_err(|_| Error::Transport("the peer went away before its answer was sent".into()))
}

/// A translator of one Transactions session, on either side: requests of the peer it
/// serves (`In`) become requests to the peer it speaks to (`Out`), whose responses
/// (`Resp`) become responses to the first (`Back`), and so do some requests (a message
/// one protocol answers and the other does not).
pub trait Translator: Send + 'static {
    type In: Send + 'static;
    type Out: Send + 'static;
    type Resp: Send + 'static;
    type Back: Send + 'static;
    fn request(
        &mut self,
        request: Self::In,
    ) -> Result<Translated<Self::Out, Self::Back>, ProtocolError>;
    fn response(&mut self, response: Self::Resp) -> Result<Vec<Self::Back>, ProtocolError>;
}

/// The runtime's side: seed requests to a current driver.
impl Translator for ClientTranslator {
    type In = m::TransactionRequest;
    type Out = cm::Request;
    type Resp = cm::Response;
    type Back = m::TransactionResponse;

    fn request(
        &mut self,
        request: m::TransactionRequest,
    ) -> Result<Translated<cm::Request, m::TransactionResponse>, ProtocolError> {
        ClientTranslator::request(self, request)
    }

    fn response(
        &mut self,
        response: cm::Response,
    ) -> Result<Vec<m::TransactionResponse>, ProtocolError> {
        ClientTranslator::response(self, response)
    }
}

/// The driver's side: a current runtime's requests to the seed's serve loop.
impl Translator for ServerTranslator {
    type In = cm::Request;
    type Out = m::TransactionRequest;
    type Resp = m::TransactionResponse;
    type Back = cm::Response;

    fn request(
        &mut self,
        request: cm::Request,
    ) -> Result<Translated<m::TransactionRequest, cm::Response>, ProtocolError> {
        ServerTranslator::request(self, request)
    }

    fn response(
        &mut self,
        response: m::TransactionResponse,
    ) -> Result<Vec<cm::Response>, ProtocolError> {
        ServerTranslator::response(self, response)
    }
}

/// Carries one Transactions session through `translator`: `inbound` requests, translated,
/// to `outbound`; the far peer's `responses`, translated, to `back`, and so what the
/// translator answers itself.
///
/// Both directions run at once (a peer blocked writing responses must not stop us
/// taking requests, nor the reverse), in this one future, sharing the translator
/// behind a lock that is held until what a translation hands `back` is sent: so `back`
/// holds everything in translation order. Ends:
/// - Ok when the far peer's responses end (after `inbound` ended and `outbound` was
///   closed, the clean end; or early, which the seed's state machine reading `back`
///   judges);
/// - with the first error: a translation's (naming the message), or either stream's.
pub async fn relay<T: Translator>(
    translator: T,
    mut inbound: BoxStream<'static, Result<T::In>>,
    outbound: mpsc::Sender<T::Out>,
    mut responses: BoxStream<'static, Result<T::Resp>>,
    back: mpsc::Sender<T::Back>,
) -> Result<()> {
    let translator = Mutex::new(translator);
    let requests = async {
        while let Some(request) = inbound.next().await {
            let out = {
                let mut translator = translator.lock().await;
                let Translated { out, back: answers } = translator.request(request?)?;
                send_back(&back, answers).await?;
                out
            };
            for request in out {
                if outbound.send(request).await.is_err() {
                    // The far peer is gone; its response stream says how.
                    return Ok(());
                }
            }
        }
        // Closing our side is the far peer's signal to finish.
        drop(outbound);
        Ok::<_, Error>(())
    };
    let responses = async {
        while let Some(response) = responses.next().await {
            let mut translator = translator.lock().await;
            let answers = translator.response(response?)?;
            send_back(&back, answers).await?;
        }
        Ok::<_, Error>(())
    };
    futures::pin_mut!(requests, responses);
    match futures::future::select(requests, responses).await {
        futures::future::Either::Left((Ok(()), responses)) => responses.await,
        futures::future::Either::Left((Err(err), _))
        | futures::future::Either::Right((Err(err), _)) => Err(err),
        futures::future::Either::Right((Ok(()), _)) => Ok(()),
    }
}

async fn send_back<B>(back: &mpsc::Sender<B>, answers: Vec<B>) -> Result<()> {
    for answer in answers {
        back.send(answer)
            .await
            .map_err(|_| Error::Transport("the session's reader went away".into()))?;
    }
    Ok(())
}
