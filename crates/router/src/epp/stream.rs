//! One ext_proc stream: one HTTP request through the gateway, from its head to the end of
//! its response. The head and the whole body are read from the stream while the gateway
//! holds the request; the request is placed as the data plane places it (tenants, the
//! router's queue, the ledger, the policy: [`dispatch::run`]) and the chosen endpoint is
//! answered, with the body echoed in the full-duplex mode. Then the response's status and
//! usage are read as they pass, and its end is noted as the data plane notes it
//! ([`steps::note_end`]); the seat is held until then.
//!
//! Body modes: `FULL_DUPLEX_STREAMED` (what the protocol asks) and `BUFFERED`, as the
//! gateway's `protocol_config` says; without one, full duplex is assumed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use http::Method;
use log::debug;
use prefix_router_core::ledger::Seat;
use prefix_router_core::request::Endpoint;
use tokio::sync::Notify;
use tokio::sync::mpsc::Sender;
use tonic::{Status, Streaming};

use super::wire::{self, Head, Phase, Side};
use crate::admission::budget::Permit;
use crate::endpoints;
use crate::error::RouterError;
use crate::fleet::{Backend, Ended, Leg};
use crate::limits::Limits;
use crate::proxy::body::{self, Body, Reading};
use crate::proxy::dispatch::{self, Answered, Route};
use crate::proxy::exchange::{Exchange, Failure};
use crate::proxy::relay::Trace;
use crate::proxy::steps::{self, Finished, PlacedRequest};
use crate::state::State;
use crate::stats::{Label, UsageScanner};
use crate::traces::RequestTrace;

/// What goes back to the gateway.
pub type Outbound = Sender<Result<ProcessingResponse, Status>>;

/// Serves the request of one stream, answering its errors as the router does.
pub async fn serve(state: Arc<State>, inbound: Streaming<ProcessingRequest>, out: Outbound) {
    let _active = state.begin();
    let mut stream = Stream {
        inbound,
        out,
        duplex: Duplex::default(),
    };
    let mut record = StatsRecord::default();
    if let Err(e) = pick(&state, &mut stream, &mut record).await {
        if let RouterError::Overloaded { shed, .. } = &e {
            state.admission.shed(*shed);
        }
        record.status = e.status();
        if e.status() > 0 {
            let _ = stream.send(wire::refusal(&e)).await;
        }
        debug!("endpoint picker: {e}");
    }
    let backend = record.backend.as_ref().map(|b| b.worker.url.as_str());
    state.stats.request(record.endpoint, record.status, backend);
}

/// What the request stats get of one request.
#[derive(Default)]
struct StatsRecord {
    endpoint: Option<Endpoint>,
    backend: Option<Arc<Backend>>,
    status: u16,
}

/// Which bodies are echoed (`FULL_DUPLEX_STREAMED`) rather than let through.
#[derive(Clone, Copy)]
struct Duplex {
    request: bool,
    response: bool,
}

impl Default for Duplex {
    fn default() -> Self {
        Duplex {
            request: true,
            response: true,
        }
    }
}

struct Stream {
    inbound: Streaming<ProcessingRequest>,
    out: Outbound,
    duplex: Duplex,
}

/// The gateway closed the stream.
fn gone() -> RouterError {
    RouterError::ClientGone("the gateway closed the stream".into())
}

impl Stream {
    async fn send(&self, message: ProcessingResponse) -> Result<(), RouterError> {
        self.out.send(Ok(message)).await.map_err(|_| gone())
    }

    /// The next message; `None` once the gateway ended the stream.
    async fn next(&mut self) -> Option<ProcessingRequest> {
        self.inbound.message().await.ok().flatten()
    }
}

/// A request read from the stream.
struct Incoming {
    head: Head,
    body: Body,
    /// The request ended with trailers rather than with its body.
    trailers: bool,
    /// The endpoints the gateway allows, when it says.
    subset: Option<Arc<[SocketAddr]>>,
}

/// Places the stream's request and answers its endpoint, then follows its response.
async fn pick(
    state: &State,
    stream: &mut Stream,
    record: &mut StatsRecord,
) -> Result<(), RouterError> {
    let live = state.live();
    let limits = &live.limits;
    let incoming = read(state, limits, stream).await?;
    let Head {
        method,
        path,
        headers,
    } = &incoming.head;
    let endpoint = (method == Method::POST)
        .then(|| Endpoint::from_path(path))
        .flatten();
    if let Some(probe) = endpoints::probe(method, path) {
        let (status, body) = steps::probe_answer(state, probe);
        record.status = status;
        return stream.send(wire::json(status, &body)).await;
    }
    if endpoints::is_admin(path) {
        return Err(RouterError::NotFound(path.clone()));
    }
    let identity = steps::identify(state, &live, headers)?;
    if method == Method::GET
        && path == "/v1/models"
        && let Some(body) = steps::models_answer(state)
    {
        record.status = 200;
        return stream.send(wire::json(200, &body)).await;
    }
    record.endpoint = endpoint;
    state.stats.body(incoming.body.bytes.len());
    let bytes = incoming.body.bytes.clone();
    let prepared = steps::prepare(state, limits, endpoint, headers, &bytes).await?;
    let tokens = prepared
        .as_ref()
        .map_or(Default::default(), |p| p.size().tokens());
    let charge =
        (state.tenancy.admit(&identity, tokens.0 as u64)).map_err(RouterError::RateLimited)?;
    let request = prepared.as_ref().map(|p| p.request(false));
    let route = request.as_ref().map_or(Route::AnyBackend, Route::Policy);
    let gate = steps::gate(state, &identity, tokens);
    // Counted in its tenant's share until the response ends.
    let _share = gate.control.enter(&gate.flow);
    let mut choosing = Choosing {
        stream: &mut *stream,
        subset: incoming.subset.clone(),
    };
    let trace = RequestTrace::default();
    let dispatched = dispatch::run(state, limits, &mut choosing, &route, gate, &trace).await;
    if let Err(RouterError::Overloaded { shed, .. }) = &dispatched.result {
        state.tenancy.shed(&identity, shed.label());
    }
    let Answered { seat, backend, .. } = dispatched.result?;
    record.backend = Some(Arc::clone(&backend));
    // With a tenants file the engine gets the request's priority, as from the proxy.
    let engine_priority = steps::engine_priority(&identity).map(|p| p.vllm());
    if let Err(e) = answer(stream, &incoming, backend.addr, engine_priority).await {
        route.released(state, backend.id);
        return Err(e);
    }
    drop(incoming);
    let sent = Instant::now();
    let seen = follow(stream, &seat, sent, || route.released(state, backend.id)).await;
    record.status = seen.trace.status;
    let held = PlacedRequest {
        backend: &backend,
        seat: &seat,
        charge: charge.as_ref(),
    };
    steps::note_end(state, limits, held, &route, seen.finished());
    Ok(())
}

/// Reads the request's head and whole body (within the body limits of the data plane).
async fn read(
    state: &State,
    limits: &Limits,
    stream: &mut Stream,
) -> Result<Incoming, RouterError> {
    let first = stream.next().await.ok_or_else(gone)?;
    if let Some(config) = &first.protocol_config {
        let duplex = |mode: i32| mode == BodySendMode::FullDuplexStreamed as i32;
        stream.duplex = Duplex {
            request: duplex(config.request_body_mode),
            response: duplex(config.response_body_mode),
        };
    }
    let subset = wire::subset(first.metadata_context.as_ref());
    let Some(Request::RequestHeaders(headers)) = first.request else {
        return Err(RouterError::Malformed(
            "the stream did not start with the request's headers".into(),
        ));
    };
    let head = wire::head(headers.headers.as_ref())?;
    let mut permit = Permit::new(&state.budget);
    let (bytes, trailers) = match headers.end_of_stream {
        true => (Bytes::new(), false),
        false => {
            if !stream.duplex.request {
                stream.send(wire::headers_continue(Side::Request)).await?;
            }
            let reading = Reading::new(limits, &state.budget);
            // Envoy passes the client's Content-Length on: the buffer is sized once.
            let declared = (head.headers.get(http::header::CONTENT_LENGTH))
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
            let buf = BytesMut::with_capacity(declared.unwrap_or(0).min(reading.limit));
            let gathered = gather(stream, buf, &mut permit, &reading);
            tokio::time::timeout(limits.client_body, gathered)
                .await
                .map_err(|_| RouterError::ClientTimeout)??
        }
    };
    Ok(Incoming {
        head,
        body: Body::new(bytes, permit),
        trailers,
        subset,
    })
}

/// The body's pieces, gathered in `buf`, until its end (or trailers: then `true`).
/// Outside the full-duplex mode, each piece but the last is let through at once; the last
/// is answered with the endpoint.
async fn gather(
    stream: &mut Stream,
    mut buf: BytesMut,
    permit: &mut Permit,
    reading: &Reading<'_>,
) -> Result<(Bytes, bool), RouterError> {
    loop {
        match stream.next().await.ok_or_else(gone)?.request {
            Some(Request::RequestBody(piece)) => {
                body::append(&mut buf, &piece.body, permit, reading).await?;
                if piece.end_of_stream {
                    return Ok((buf.freeze(), false));
                }
                if !stream.duplex.request {
                    stream.send(wire::body_continue(Side::Request)).await?;
                }
            }
            Some(Request::RequestTrailers(_)) => return Ok((buf.freeze(), true)),
            _ => return Err(RouterError::Malformed("unexpected message".into())),
        }
    }
}

/// Names `addr` as the request's endpoint (with its `engine_priority`), where the body
/// mode wants it, and gives the body back in the full-duplex mode.
async fn answer(
    stream: &Stream,
    incoming: &Incoming,
    addr: SocketAddr,
    engine_priority: Option<i64>,
) -> Result<(), RouterError> {
    let bytes = &incoming.body.bytes;
    let bodiless = bytes.is_empty() && !incoming.trailers;
    if stream.duplex.request || bodiless {
        stream
            .send(wire::destination(
                addr,
                Phase::RequestHeaders,
                engine_priority,
            ))
            .await?;
        if !bodiless {
            for piece in wire::echo(Side::Request, bytes, !incoming.trailers) {
                stream.send(piece).await?;
            }
        }
    } else {
        stream
            .send(wire::destination(addr, Phase::RequestBody, engine_priority))
            .await?;
    }
    if incoming.trailers {
        stream.send(wire::trailers_continue(Side::Request)).await?;
    }
    Ok(())
}

/// What was seen of the response.
#[derive(Default)]
struct Seen {
    trace: Trace,
    /// It asked to be retried later (`Retry-After`).
    retry_after: bool,
    /// Its status was not a success.
    refused: bool,
    /// Its end passed (rather than the stream ending first).
    complete: bool,
}

impl Seen {
    /// How the exchange ended, as far as the stream showed it.
    fn finished(&self) -> Finished<'_> {
        let status = self.trace.status;
        Finished {
            ended: match status {
                0 => Ended::Answered,
                status => Ended::of_status(status, self.retry_after),
            },
            released: self.refused,
            // Without response processing nothing is seen: nothing says it failed.
            served: status == 0 || (self.complete && !self.refused),
            trace: Some(&self.trace).filter(|_| status > 0),
            leg: Leg::Whole,
        }
    }
}

/// Follows the response through the stream until its end: its status (a refusal calls
/// `refused` at once), its first body byte (the request is answered) and its usage.
async fn follow(stream: &mut Stream, seat: &Seat, sent: Instant, refused: impl FnOnce()) -> Seen {
    let mut seen = Seen::default();
    let mut usage = UsageScanner::default();
    let mut refused = Some(refused);
    while let Some(message) = stream.next().await {
        let (answers, end) = match message.request {
            Some(Request::ResponseHeaders(headers)) => {
                let (status, retry_after) = wire::status(headers.headers.as_ref());
                (seen.trace.status, seen.retry_after) = (status, retry_after);
                if !(200..300).contains(&status) {
                    seen.refused = true;
                    if let Some(released) = refused.take() {
                        released();
                    }
                }
                let answer = wire::headers_continue(Side::Response);
                (vec![answer], headers.end_of_stream)
            }
            Some(Request::ResponseBody(piece)) => {
                if seen.trace.first_byte.is_none() && !piece.body.is_empty() {
                    seat.answered();
                    seen.trace.first_byte = Some(sent.elapsed());
                }
                usage.feed(&piece.body);
                let answers = match stream.duplex.response {
                    true => wire::echo(Side::Response, &piece.body, piece.end_of_stream).collect(),
                    false => vec![wire::body_continue(Side::Response)],
                };
                (answers, piece.end_of_stream)
            }
            Some(Request::ResponseTrailers(_)) => {
                (vec![wire::trailers_continue(Side::Response)], true)
            }
            _ => (Vec::new(), false),
        };
        for answer in answers {
            if stream.send(answer).await.is_err() {
                break;
            }
        }
        if end {
            seen.complete = true;
            break;
        }
    }
    seen.trace.total = sent.elapsed();
    seen.trace.usage = usage.usage();
    seen
}

/// Placing the request for the gateway: "sending" it to a backend is naming it, which
/// cannot fail; the gateway closing the stream is the client leaving.
struct Choosing<'s> {
    stream: &'s mut Stream,
    subset: Option<Arc<[SocketAddr]>>,
}

#[async_trait]
impl Exchange for Choosing<'_> {
    type Answer = ();

    /// Never stopped: the gateway relays the request, so nothing here can preempt it.
    async fn send(&mut self, _: &Backend, _: Option<&Notify>) -> Result<(), Failure> {
        Ok(())
    }

    async fn client_gone(&mut self) -> RouterError {
        // Nothing else comes before the endpoint is answered.
        while self.stream.next().await.is_some() {
            debug!("endpoint picker: a message before the endpoint was answered; ignored");
        }
        gone()
    }

    /// A retry is the gateway's to make: its endpoint was only named here.
    fn replayable(&self) -> bool {
        false
    }

    fn ended(_: &()) -> Ended {
        Ended::Answered
    }

    fn subset(&self) -> Option<Arc<[SocketAddr]>> {
        self.subset.clone()
    }
}
