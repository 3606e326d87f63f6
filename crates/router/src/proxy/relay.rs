//! The transport: one request to one backend, and nothing else. Done by our own code
//! because Pingora cannot choose an upstream after reading a body larger than its 64 KiB
//! retry buffer: a pooled connection, the buffered body written as is, the response
//! streamed back chunk by chunk without buffering. [`Upstream`] is the request's
//! [`Exchange`]: it says how an attempt ended and whether another backend may be tried;
//! choosing, retrying, health and stats are the dispatch loop's.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::Stream;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::{HttpSession as Http1, http_req_header_to_wire};
use pingora_core::upstreams::peer::Peer;
use pingora_core::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use prefix_router_core::BackendId;
use prefix_router_core::ledger::Seat;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::body::Body;
use super::exchange::{Exchange, Failure};
use super::headers;
use crate::error::RouterError;
use crate::fleet::{Backend, Ended, Leg};
use crate::limits::ExchangeTimeouts;
use crate::responses::{IdNote, ResponseHomes};
use crate::stats::{Usage, UsageScanner};
use crate::traces::{ExchangeEnd, ExchangeSpan, RequestTrace};

/// A client's request on its way to backends: its head made ready for upstream and its
/// whole body, held until a backend's response head arrives.
pub struct Upstream<'s> {
    /// The client's session.
    pub session: &'s mut Session,
    /// Pooled connections.
    pub connector: &'s TransportConnector,
    /// The head, without Host (set per backend).
    pub head: RequestHeader,
    /// The body, forwarded byte for byte; held until dispatching ends (a 5xx answer may be
    /// retried on another backend).
    pub body: Option<Body>,
    /// The request's id, sent to the backend.
    pub request_id: &'s str,
    /// Timeouts of each attempt.
    pub timeouts: &'s ExchangeTimeouts,
    /// The request's trace: each attempt is a span of it.
    pub trace: &'s RequestTrace,
    /// Whether a second attempt can repeat no effect ([`Exchange::replayable`]).
    pub replayable: bool,
    /// The backends it may go to, when it names a stored response ([`Exchange::subset`]).
    pub subset: Option<Arc<[SocketAddr]>>,
    /// The leg it carries ([`Exchange::leg`]).
    pub leg: Leg,
}

#[async_trait]
impl Exchange for Upstream<'_> {
    type Answer = Answering;

    async fn send(
        &mut self,
        backend: &Backend,
        stop: Option<&Notify>,
    ) -> Result<Answering, Failure> {
        let body = self
            .body
            .as_ref()
            .map_or_else(Bytes::new, |b| b.bytes.clone());
        let span = self.trace.exchange(&backend.authority, self.leg.name());
        match self.attempt(backend, &body, &span, stop).await {
            Ok(mut answering) => {
                answering.span = span;
                Ok(answering)
            }
            Err(failure) => {
                span.end(ExchangeEnd {
                    error: Some(failure.error()),
                    ..ExchangeEnd::default()
                });
                Err(failure)
            }
        }
    }

    async fn client_gone(&mut self) -> RouterError {
        match self.session.read_body_or_idle(true).await {
            Err(e) => client_gone(e),
            Ok(_) => std::future::pending().await,
        }
    }

    fn subset(&self) -> Option<Arc<[SocketAddr]>> {
        self.subset.clone()
    }

    fn replayable(&self) -> bool {
        self.replayable
    }

    fn leg(&self) -> Leg {
        self.leg
    }

    fn ended(answer: &Answering) -> Ended {
        answer.ended()
    }
}

impl Upstream<'_> {
    /// Makes it carry `leg` with `body` (framed by its length).
    pub fn set_body(&mut self, body: Bytes, leg: Leg) {
        // A length is always a valid header value.
        let _ = (self.head).insert_header(http::header::CONTENT_LENGTH, body.len());
        self.head.remove_header(&http::header::TRANSFER_ENCODING);
        if let Some(held) = &mut self.body {
            held.replace(body);
        }
        self.leg = leg;
    }

    /// Sends the request to `backend`, with `span` as its trace parent, and waits for its
    /// final response head (and, with `stop`, a success's first body bytes, unless `stop`
    /// is notified first).
    async fn attempt(
        &mut self,
        backend: &Backend,
        body: &Bytes,
        span: &ExchangeSpan,
        stop: Option<&Notify>,
    ) -> Result<Answering, Failure> {
        let connect = |e: Box<Error>| Failure::Unsent(upstream_error(&e));
        let (stream, reused) = (self.connector)
            .get_stream(&backend.peer)
            .await
            .map_err(connect)?;
        match self
            .exchange(stream, reused, backend, body, span, stop)
            .await
        {
            // A pooled connection the backend closed as it was taken (a server's keep-alive
            // timeout, uvicorn's 5 s for vLLM): nothing was answered, once more on a new one.
            Err(Failure::Unsent(_)) if reused => {
                let stream = (self.connector)
                    .new_stream(&backend.peer)
                    .await
                    .map_err(connect)?;
                self.exchange(stream, false, backend, body, span, stop)
                    .await
            }
            done => done,
        }
    }

    /// The request on `stream` (`reused` from the pool), until its final response head.
    async fn exchange(
        &mut self,
        mut stream: Stream,
        reused: bool,
        backend: &Backend,
        body: &Bytes,
        span: &ExchangeSpan,
        stop: Option<&Notify>,
    ) -> Result<Answering, Failure> {
        let timeouts = self.timeouts;
        let mut req = self.head.clone();
        headers::set_host(&mut req, &backend.authority);
        // The id is a printable token (checked or made by `headers::request_id`).
        let _ = req.insert_header(headers::X_REQUEST_ID, self.request_id);
        span.inject(&mut req);
        let sent = Instant::now();
        let one = one_write(&req, body);
        if let Some(wire) = &one {
            write_all(&mut stream, wire, timeouts.write)
                .await
                .map_err(Failure::Unsent)?;
        }
        let mut upstream = HttpSession::H1(Http1::new_with_options(stream, &backend.peer));
        upstream.set_read_timeout(Some(timeouts.first_byte));
        upstream.set_write_timeout(Some(timeouts.write));
        if one.is_none() {
            send_request(&mut upstream, req, body)
                .await
                .map_err(Failure::Unsent)?;
        }
        let answer = read_answer(&mut upstream, sent, stop.is_some());
        let answer = until_client_gone(self.session, until_stopped(stop, answer)).await;
        match answer.map_err(Failure::Final)?? {
            Ok(first) => Ok(Answering {
                upstream,
                sent,
                first,
                reuse: backend.peer.reuse_hash(),
                backend: backend.id,
                span: ExchangeSpan::default(),
            }),
            Err(Read::Head(e)) if reused => Err(Failure::Unsent(upstream_error(&e))),
            Err(Read::Head(e) | Read::Body(e)) => Err(Failure::Unanswered(upstream_error(&e))),
        }
    }
}

/// What was seen of a response on its way through.
#[derive(Debug, Default)]
pub struct Trace {
    /// The backend's response status.
    pub status: u16,
    /// From sending the request to the first response body byte.
    pub first_byte: Option<Duration>,
    /// From sending the request to the end (or failure) of the response.
    pub total: Duration,
    /// The usage the backend reported, if it did.
    pub usage: Option<Usage>,
}

/// How one exchange ended.
pub struct Exchanged {
    /// What was seen of the response, when one started.
    pub trace: Option<Trace>,
    /// Whether it was served.
    pub result: Result<(), Failure>,
}

/// A response whose final head arrived from the backend: no retry can need the request's
/// body any more.
pub struct Answering {
    upstream: HttpSession,
    sent: Instant,
    /// Its first body bytes, when they were read with the head.
    first: First,
    /// The backend's connection pool key.
    reuse: u64,
    /// The backend answering.
    backend: BackendId,
    /// The attempt's trace span, ended with the response.
    span: ExchangeSpan,
}

impl Answering {
    /// What its status says of the backend's health.
    pub fn ended(&self) -> Ended {
        let Some(head) = self.upstream.response_header() else {
            return Ended::Answered;
        };
        let retry_after = head.headers.contains_key(http::header::RETRY_AFTER);
        Ended::of_status(head.status.as_u16(), retry_after)
    }

    /// Whether its status is a success (2xx).
    pub fn succeeded(&self) -> bool {
        (self.upstream.response_header()).is_some_and(|h| h.status.is_success())
    }

    /// Streams the response to the client (closing its connection when `closing`); the
    /// first body byte marks `seat` answered. The connection goes back to the pool when
    /// the response ended cleanly.
    pub async fn relay(
        mut self,
        connector: &TransportConnector,
        session: &mut Session,
        seat: &Seat,
        reply: Reply<'_>,
        timeouts: &ExchangeTimeouts,
    ) -> Exchanged {
        if reply.closing {
            session.set_keepalive(None);
        }
        let mut seen = Trace::default();
        let mut response = Response {
            seat,
            sent: self.sent,
            first: self.first.take(),
            seen: &mut seen,
            usage: UsageScanner::default(),
            id: (reply.learns_id.filter(|_| self.succeeded()))
                .map(|homes| IdNote::new(homes, self.backend)),
            idle: timeouts.idle,
        };
        let streamed = response
            .stream(session, &mut self.upstream, reply.request_id)
            .await;
        let usage = response.usage.usage();
        self.end(seen, usage, streamed, (connector, timeouts)).await
    }

    /// Reads the whole response for the router itself (the prefill leg of a disaggregated
    /// request), at most `limit` bytes, unless the client leaves first; the first body
    /// byte marks `seat` answered. The connection goes back to the pool when it was read
    /// to its end.
    pub async fn collect(
        mut self,
        connector: &TransportConnector,
        session: &mut Session,
        seat: &Seat,
        timeouts: &ExchangeTimeouts,
        limit: usize,
    ) -> (Exchanged, Bytes) {
        let mut seen = Trace {
            status: (self.upstream.response_header()).map_or(0, |h| h.status.as_u16()),
            ..Trace::default()
        };
        let mut usage = UsageScanner::default();
        let mut body = bytes::BytesMut::new();
        let mut first = self.first.take();
        let (upstream, sent) = (&mut self.upstream, self.sent);
        let read = async {
            loop {
                let (chunk, at) = match first.take() {
                    Some(first) => first,
                    None => {
                        let chunk = upstream.read_response_body().await;
                        let chunk = chunk.map_err(|e| aborted(&crate::error::reason(&e)))?;
                        (chunk, sent.elapsed())
                    }
                };
                if seen.first_byte.is_none() {
                    seat.answered();
                    seen.first_byte = Some(at);
                    upstream.set_read_timeout(Some(timeouts.idle));
                }
                let Some(bytes) = chunk else {
                    return Ok(());
                };
                if body.len() + bytes.len() > limit {
                    return Err(aborted("the answer is larger than the router reads"));
                }
                usage.feed(&bytes);
                body.extend_from_slice(&bytes);
            }
        };
        let result = until_client_gone(session, read).await.and_then(|read| read);
        let usage = usage.usage();
        let exchanged = self.end(seen, usage, result, (connector, timeouts)).await;
        (exchanged, body.freeze())
    }

    /// Ends the exchange once its response was read (`result`): its trace completed with
    /// `usage`, its span ended, its connection pooled when the response ended cleanly.
    async fn end(
        mut self,
        mut seen: Trace,
        usage: Option<Usage>,
        result: Result<(), RouterError>,
        (connector, timeouts): (&TransportConnector, &ExchangeTimeouts),
    ) -> Exchanged {
        seen.total = self.sent.elapsed();
        seen.usage = usage;
        let span = std::mem::take(&mut self.span);
        span.end(ExchangeEnd {
            status: seen.status,
            first_byte: seen.first_byte,
            usage: seen.usage.map(|u| (u.prompt, u.cached)),
            error: result.as_ref().err(),
        });
        if result.is_ok() {
            self.pool(connector, timeouts).await;
        }
        Exchanged {
            trace: Some(seen),
            result: result.map_err(Failure::Final),
        }
    }

    async fn pool(self, connector: &TransportConnector, timeouts: &ExchangeTimeouts) {
        if let HttpSession::H1(mut h1) = self.upstream {
            h1.respect_keepalive();
            if let Some(stream) = h1.reuse().await {
                connector.release_stream(stream, self.reuse, Some(timeouts.pool_idle));
            }
        }
    }
}

/// What the client's response needs besides the backend's.
#[derive(Clone, Copy)]
pub struct Reply<'r> {
    /// The request's id, sent back to the client.
    pub request_id: &'r str,
    /// Whether the response should close the client connection (shutdown or upgrade).
    pub closing: bool,
    /// Where to note the response id it makes, when successful (a `POST /v1/responses`).
    pub learns_id: Option<&'r ResponseHomes>,
    /// The leg it answers.
    pub leg: Leg,
}

/// Bodies up to this size go upstream in the same write as the head (one copy of at most
/// this many bytes saves a system call and a loopback wakeup per request).
const ONE_WRITE_BODY: usize = 16 << 10;

/// The whole request as one buffer, when it can go in one write: a small body framed by
/// Content-Length (or none), and not HEAD (whose response Pingora's reader must know has
/// no body: those go through [`send_request`]).
fn one_write(req: &RequestHeader, body: &Bytes) -> Option<bytes::BytesMut> {
    let framed = body.is_empty() || req.headers.contains_key(http::header::CONTENT_LENGTH);
    let plain = !req.headers.contains_key(http::header::TRANSFER_ENCODING);
    if body.len() > ONE_WRITE_BODY || !framed || !plain || req.method == http::Method::HEAD {
        return None;
    }
    let mut wire = http_req_header_to_wire(req)?;
    wire.extend_from_slice(body);
    Some(wire)
}

/// Writes `wire` and flushes within `timeout`.
async fn write_all(stream: &mut Stream, wire: &[u8], timeout: Duration) -> Result<(), RouterError> {
    let write = async {
        stream.write_all(wire).await?;
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(RouterError::Upstream(format!("writing the request: {e}"))),
        Err(_) => Err(RouterError::Upstream(
            "writing the request timed out".into(),
        )),
    }
}

/// Writes the request through Pingora's HTTP/1 client (large, chunked or HEAD requests).
async fn send_request(
    upstream: &mut HttpSession,
    req: RequestHeader,
    body: &Bytes,
) -> Result<(), RouterError> {
    let error = |e: Box<Error>| upstream_error(&e);
    upstream
        .write_request_header(Box::new(req))
        .await
        .map_err(error)?;
    if !body.is_empty() {
        upstream
            .write_request_body(body.clone(), true)
            .await
            .map_err(error)?;
    }
    upstream.finish_request_body().await.map_err(error)
}

/// A response's first body bytes (`None`: the body ended at once), read before its head
/// is relayed, and when they arrived after the request was sent.
type First = Option<(Option<Bytes>, Duration)>;

/// Where reading an answer failed.
enum Read {
    /// Before its final head.
    Head(Box<Error>),
    /// After its head, before any body byte reached the client.
    Body(Box<Error>),
}

/// Reads a response's final head and, when `first` and it is a success, its first body
/// bytes.
async fn read_answer(
    upstream: &mut HttpSession,
    sent: Instant,
    first: bool,
) -> Result<First, Read> {
    read_final_header(upstream).await.map_err(Read::Head)?;
    let success = (upstream.response_header()).is_some_and(|h| h.status.is_success());
    if !first || !success {
        return Ok(None);
    }
    let chunk = upstream.read_response_body().await.map_err(Read::Body)?;
    Ok(Some((chunk, sent.elapsed())))
}

/// Runs `work` unless `stop` is notified first ([`Failure::Preempted`]).
async fn until_stopped<T>(
    stop: Option<&Notify>,
    work: impl Future<Output = T>,
) -> Result<T, Failure> {
    let Some(stop) = stop else {
        return Ok(work.await);
    };
    tokio::select! {
        biased;
        () = stop.notified() => Err(Failure::Preempted),
        out = work => Ok(out),
    }
}

/// Reads response headers until a final (non-1xx) one.
async fn read_final_header(upstream: &mut HttpSession) -> pingora_core::Result<()> {
    loop {
        upstream.read_response_header().await?;
        let status = upstream
            .response_header()
            .map_or(200, |h| h.status.as_u16());
        if !(100..200).contains(&status) || status == 101 {
            return Ok(());
        }
    }
}

/// A response on its way to the client.
struct Response<'r> {
    seat: &'r Seat,
    sent: Instant,
    first: First,
    seen: &'r mut Trace,
    usage: UsageScanner,
    id: Option<IdNote<'r>>,
    idle: Duration,
}

impl Response<'_> {
    /// Copies the response header and body to the client as they arrive. The first body
    /// bytes mark the request answered (a stream's header comes before its prefill is done).
    async fn stream(
        &mut self,
        session: &mut Session,
        upstream: &mut HttpSession,
        request_id: &str,
    ) -> Result<(), RouterError> {
        let head = upstream
            .response_header()
            .ok_or_else(|| aborted("no response header"))?;
        self.seen.status = head.status.as_u16();
        let mut resp = headers::client_response(head);
        let _ = resp.insert_header(headers::X_REQUEST_ID, request_id);
        session
            .write_response_header(resp, false)
            .await
            .map_err(client_gone)?;
        if let Some((chunk, at)) = self.first.take() {
            self.answered(upstream, at);
            if self.forward(session, chunk).await? {
                return Ok(());
            }
        }
        loop {
            let chunk = until_client_gone(session, upstream.read_response_body()).await?;
            if self.seen.first_byte.is_none() {
                self.answered(upstream, self.sent.elapsed());
            }
            let chunk = chunk.map_err(|e| aborted(&crate::error::reason(&e)))?;
            if self.forward(session, chunk).await? {
                return Ok(());
            }
        }
    }

    /// The first body bytes arrived `at` after the request was sent.
    fn answered(&mut self, upstream: &mut HttpSession, at: Duration) {
        self.seat.answered();
        self.seen.first_byte = Some(at);
        upstream.set_read_timeout(Some(self.idle));
    }

    /// Writes `chunk` to the client, or ends the response (`None`); whether it ended.
    async fn forward(
        &mut self,
        session: &mut Session,
        chunk: Option<Bytes>,
    ) -> Result<bool, RouterError> {
        let Some(bytes) = chunk else {
            session
                .write_response_body(None, true)
                .await
                .map_err(client_gone)?;
            return Ok(true);
        };
        self.usage.feed(&bytes);
        if let Some(id) = &mut self.id {
            id.feed(&bytes);
        }
        (session.write_response_body(Some(bytes), false).await).map_err(client_gone)?;
        Ok(false)
    }
}

/// Runs `work` unless the client disconnects first.
async fn until_client_gone<T>(
    session: &mut Session,
    work: impl Future<Output = T>,
) -> Result<T, RouterError> {
    tokio::pin!(work);
    tokio::select! {
        biased;
        out = &mut work => Ok(out),
        idle = session.read_body_or_idle(true) => match idle {
            Err(e) => Err(client_gone(e)),
            Ok(_) => Ok(work.await),
        },
    }
}

fn upstream_error(e: &Error) -> RouterError {
    match e.etype() {
        ErrorType::ConnectTimedout => RouterError::UpstreamTimeout("connecting"),
        ErrorType::ReadTimedout => RouterError::UpstreamTimeout("waiting for the response"),
        _ => RouterError::Upstream(crate::error::reason(e)),
    }
}

fn client_gone(e: Box<Error>) -> RouterError {
    RouterError::ClientGone(crate::error::reason(&e))
}

fn aborted(reason: &str) -> RouterError {
    RouterError::Aborted(reason.to_string())
}
