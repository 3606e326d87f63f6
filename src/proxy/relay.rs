//! The upstream exchange, done by our own code because Pingora cannot choose an upstream after
//! reading a body larger than its 64 KiB retry buffer: one pooled connection per attempt,
//! the buffered body written as is, the response streamed back chunk by chunk without
//! buffering. A failed connection is retried on another backend while nothing can have
//! reached the first; once the response has started, a failure cuts the client's stream.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for backends' first health checks before answering 503.
const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

use bytes::Bytes;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::Stream;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::{HttpSession as Http1, http_req_header_to_wire};
use pingora_core::upstreams::peer::Peer;
use pingora_core::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use smallvec::SmallVec;
use tokio::io::AsyncWriteExt;

use super::headers;
use crate::BackendId;
use crate::config::Timeouts;
use crate::error::RouterError;
use crate::fleet::{Backend, Fleet, LoadGuard};
use crate::policy::{Candidate, Decision};
use crate::stats::{Stats, UsageScanner};

/// Where an attempt failed, which decides whether another backend may be tried.
enum Failure {
    /// Nothing reached the backend, or a reused connection failed before any answer (the
    /// backend had closed it): safe to try another backend.
    Retryable(RouterError),
    /// The backend may have the request, or the client has part of the response.
    Final(RouterError),
}

/// What one routed exchange needs besides the client session.
pub struct Exchange<'e> {
    /// Connection pool.
    pub connector: &'e TransportConnector,
    /// Backends.
    pub fleet: &'e Fleet,
    /// Metrics.
    pub stats: &'e Stats,
    /// Upstream timeouts.
    pub timeouts: &'e Timeouts,
    /// Other backends to try after a retryable failure.
    pub retries: usize,
    /// Length of the request's routing text (0 for unrouted paths), bytes.
    pub text_len: usize,
    /// Whether the response should close the client connection (shutdown or upgrade).
    pub closing: bool,
    /// Failed exchanges in a row that take a backend out (0: never).
    pub passive_failures: usize,
    /// The request's id, sent to the backend and back to the client.
    pub request_id: &'e str,
}

/// The backend a request went to, and why.
pub struct Placement {
    /// The backend.
    pub backend: Arc<Backend>,
    /// The policy's decision.
    pub decision: Decision,
}

impl Exchange<'_> {
    /// Sends `req` with `body` to a backend picked by `choose` among the ready ones (never
    /// called with none), retrying elsewhere as allowed; `placed` hears of every placement.
    pub async fn run(
        &self,
        session: &mut Session,
        req: &RequestHeader,
        body: &Bytes,
        choose: impl Fn(&[Candidate]) -> Decision,
        mut placed: impl FnMut(Placement),
    ) -> Result<(), RouterError> {
        let mut tried: SmallVec<[BackendId; 4]> = SmallVec::new();
        let mut last_error = RouterError::NoBackend;
        let started = Instant::now();
        loop {
            let ready = self.fleet.ready(&tried);
            if ready.candidates.is_empty() {
                // Right after a start or an upgrade no backend was checked yet: wait for the
                // first checks rather than refuse the request.
                if tried.is_empty()
                    && self.fleet.awaiting_first_check()
                    && started.elapsed() < FIRST_CHECK_WAIT
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                return Err(last_error);
            }
            let decision = choose(&ready.candidates);
            let backend = ready
                .backend(decision.index)
                .ok_or(RouterError::NoBackend)?;
            let load = backend.acquire(self.text_len.saturating_sub(decision.matched));
            placed(Placement {
                backend: Arc::clone(load.backend()),
                decision,
            });
            let result = self.attempt(session, &load, req, body).await;
            self.note_health(load.backend(), &result);
            match result {
                Ok(()) => return Ok(()),
                Err(Failure::Retryable(e)) if tried.len() < self.retries => {
                    log::warn!("{}: {e}; trying another backend", load.backend().worker.url);
                    self.stats.retries.inc();
                    tried.push(load.backend().id);
                    last_error = e;
                }
                Err(Failure::Retryable(e)) | Err(Failure::Final(e)) => return Err(e),
            }
        }
    }

    async fn attempt(
        &self,
        session: &mut Session,
        load: &LoadGuard,
        req: &RequestHeader,
        body: &Bytes,
    ) -> Result<(), Failure> {
        let backend = load.backend();
        let (mut stream, reused) = self
            .connector
            .get_stream(&backend.peer)
            .await
            .map_err(|e| Failure::Retryable(upstream_error(&e)))?;
        let mut req = req.clone();
        headers::set_host(&mut req, &backend.authority);
        // The id is a printable token (checked or made by `headers::request_id`).
        let _ = req.insert_header(headers::X_REQUEST_ID, self.request_id);
        let sent = Instant::now();
        let one = one_write(&req, body);
        if let Some(wire) = &one {
            let timeout = self.timeouts.upstream_write;
            write_all(&mut stream, wire, timeout)
                .await
                .map_err(Failure::Retryable)?;
        }
        let mut upstream = HttpSession::H1(Http1::new_with_options(stream, &backend.peer));
        upstream.set_read_timeout(Some(self.timeouts.first_byte));
        upstream.set_write_timeout(Some(self.timeouts.upstream_write));
        if one.is_none() {
            send(&mut upstream, req, body)
                .await
                .map_err(Failure::Retryable)?;
        }
        let head = until_client_gone(session, read_final_header(&mut upstream)).await;
        match head.map_err(Failure::Final)? {
            Ok(()) => {}
            Err(e) if reused => return Err(Failure::Retryable(upstream_error(&e))),
            Err(e) => return Err(Failure::Final(upstream_error(&e))),
        }
        let mut trace = Trace {
            sent,
            first_byte: None,
            usage: UsageScanner::default(),
        };
        if self.closing {
            session.set_keepalive(None);
        }
        let idle = self.timeouts.upstream_idle;
        let id = self.request_id;
        let streamed = stream_response(session, &mut upstream, load, &mut trace, idle, id).await;
        self.record(backend, &trace);
        streamed.map_err(Failure::Final)?;
        if let HttpSession::H1(mut h1) = upstream {
            h1.respect_keepalive();
            if let Some(stream) = h1.reuse().await {
                let (hash, idle) = (backend.peer.reuse_hash(), Some(self.timeouts.pool_idle));
                self.connector.release_stream(stream, hash, idle);
            }
        }
        Ok(())
    }

    /// Counts transport failures towards passive health (not the client's, not statuses).
    fn note_health(&self, backend: &Backend, result: &Result<(), Failure>) {
        let failed = match result {
            Ok(()) => false,
            Err(Failure::Retryable(e) | Failure::Final(e)) => e.is_upstream_fault(),
        };
        if backend.record_exchange(!failed, self.passive_failures) {
            log::warn!(
                "{} failed {} exchanges in a row; out until its next passed health check",
                backend.worker.url,
                self.passive_failures
            );
        }
    }

    fn record(&self, backend: &Backend, trace: &Trace) {
        let name = backend.worker.url.as_str();
        if let Some(first) = trace.first_byte {
            let ttfb = first.duration_since(trace.sent).as_secs_f64();
            self.stats.ttfb.with_label_values(&[name]).observe(ttfb);
        }
        let total = trace.sent.elapsed().as_secs_f64();
        self.stats
            .upstream_duration
            .with_label_values(&[name])
            .observe(total);
        if let Some(usage) = trace.usage.usage() {
            self.stats.usage(name, usage);
        }
    }
}

/// What is learned of a response on its way through.
struct Trace {
    sent: Instant,
    first_byte: Option<Instant>,
    usage: UsageScanner,
}

/// Bodies up to this size go upstream in the same write as the head (one copy of at most
/// this many bytes saves a system call and a loopback wakeup per request).
const ONE_WRITE_BODY: usize = 16 << 10;

/// The whole request as one buffer, when it can go in one write: a small body framed by
/// Content-Length (or none), and not HEAD (whose response Pingora's reader must know has
/// no body: those go through [`send`]).
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
async fn send(
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

/// Copies the response header and body to the client as they arrive. The first body bytes
/// mark the request answered (a stream's header comes before its prefill is done).
async fn stream_response(
    session: &mut Session,
    upstream: &mut HttpSession,
    load: &LoadGuard,
    trace: &mut Trace,
    idle: Duration,
    request_id: &str,
) -> Result<(), RouterError> {
    let head = upstream
        .response_header()
        .ok_or_else(|| aborted("no response header"))?;
    let mut resp = headers::client_response(head);
    let _ = resp.insert_header(headers::X_REQUEST_ID, request_id);
    session
        .write_response_header(resp, false)
        .await
        .map_err(client_gone)?;
    loop {
        let chunk = until_client_gone(session, upstream.read_response_body()).await?;
        if trace.first_byte.is_none() {
            load.answered();
            trace.first_byte = Some(Instant::now());
            upstream.set_read_timeout(Some(idle));
        }
        match chunk.map_err(|e| aborted(&e.to_string()))? {
            Some(bytes) => {
                trace.usage.feed(&bytes);
                session.write_response_body(Some(bytes), false).await
            }
            None => {
                return session
                    .write_response_body(None, true)
                    .await
                    .map_err(client_gone);
            }
        }
        .map_err(client_gone)?;
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
        ErrorType::ReadTimedout | ErrorType::ConnectTimedout => RouterError::UpstreamTimeout,
        _ => RouterError::Upstream(e.to_string()),
    }
}

fn client_gone(e: Box<Error>) -> RouterError {
    RouterError::ClientGone(e.to_string())
}

fn aborted(reason: &str) -> RouterError {
    RouterError::Aborted(reason.to_string())
}
