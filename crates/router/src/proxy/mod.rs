//! The Pingora `ProxyHttp` service. It only wires phases together: `request_filter` reads the
//! body, asks the core's `request` for the routing text, and hands the request to
//! `dispatch`, which places it and relays it (`relay`, the transport); `fail_to_proxy` is
//! the one place errors become HTTP responses; `logging` writes one line per request.

mod body;
mod budget;
mod dispatch;
mod headers;
mod queue;
mod relay;

pub use budget::Budget;
pub use queue::Queue;
pub use relay::ExchangeTimeouts;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use log::{debug, warn};
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use prefix_router_core::policy::Request;
use prefix_router_core::request::{self, Endpoint, SessionHeaders, SessionKey};

use crate::error::RouterError;
use crate::serve::admin;
use crate::state::{Active, State};
use dispatch::{Answered, Placed, Route};
use relay::{Outbound, Reply};

/// What each request may take and do, replaced as a whole on reload.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest request body, bytes. Default 32 MiB.
    pub max_body_bytes: usize,
    /// Silence allowed from a client sending its body. Default 60 s.
    pub client_read: Duration,
    /// Whole time a client may take to send its body (32 MiB at about 110 KB/s). Default 300 s.
    pub client_body: Duration,
    /// Other backends tried after a failed connection. Default 2.
    pub retries: usize,
    /// Failed exchanges in a row that take a backend out until its next passed health
    /// check; 0 disables. Default 3.
    pub passive_failures: usize,
    /// Session id headers, in order of preference. Default `x-session-id`.
    pub session_headers: SessionHeaders,
    /// Timeouts of each exchange with a backend.
    pub exchange: ExchangeTimeouts,
    /// Longest wait of a body for buffer budget before 503. Default 10 s.
    pub admission_timeout: Duration,
    /// Requests in flight per backend at most; 0: no limit. Default 0.
    pub max_inflight_per_backend: usize,
    /// Requests waiting in the router's queue at most. Default 1024.
    pub max_queued: usize,
    /// Longest wait in the router's queue before 503. Default 30 s.
    pub queue_timeout: Duration,
}

/// The proxy service.
pub struct Router {
    state: Arc<State>,
}

impl Router {
    /// A proxy over `state`.
    pub fn new(state: Arc<State>) -> Self {
        Router { state }
    }
}

/// Per-request state.
pub struct Ctx {
    _active: Active,
    request_id: String,
    started: Instant,
    route: &'static str,
    text_len: usize,
    placed: Option<Placed>,
    failure: Option<RouterError>,
}

#[async_trait]
impl ProxyHttp for Router {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            _active: self.state.begin(),
            request_id: String::new(),
            started: Instant::now(),
            route: "other",
            text_len: 0,
            placed: None,
            failure: None,
        }
    }

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        match self.serve(session, ctx).await {
            Ok(()) => Ok(true),
            Err(e) => {
                let status = e.status();
                ctx.failure = Some(e);
                Error::e_explain(ErrorType::HTTPStatus(status), "request not served")
            }
        }
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut Ctx) -> Result<Box<HttpPeer>> {
        Error::e_explain(
            ErrorType::InternalError,
            "requests are relayed in request_filter",
        )
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let failure = ctx
            .failure
            .get_or_insert_with(|| RouterError::Upstream(crate::error::reason(e)));
        let status = respond_error(session, failure).await;
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _: &Session, _: &Ctx, _: &Error) -> bool {
        true
    }

    async fn logging(&self, session: &mut Session, _: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let backend = ctx.placed.as_ref().map(|p| p.backend.worker.url.as_str());
        self.state.stats.request(ctx.route, status, backend);
        log_request(session, ctx, status);
    }
}

impl Router {
    async fn serve(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), RouterError> {
        let state = &*self.state;
        let limits = state.limits();
        let head = session.req_header();
        ctx.request_id = headers::request_id(head);
        let path = head.uri.path();
        if admin::serves(path) {
            return Err(RouterError::NotFound(path.to_string()));
        }
        let endpoint = (head.method == Method::POST)
            .then(|| Endpoint::from_path(path))
            .flatten();
        ctx.route = endpoint.map_or("other", Endpoint::label);
        let reading = body::Reading {
            limit: limits.max_body_bytes,
            pause: limits.client_read,
            total: limits.client_body,
            admission: limits.admission_timeout,
            budget: &state.budget,
        };
        let read = body::read(session, &reading).await;
        let body = read.inspect_err(|e| note_shed(state, e))?;
        state.stats.body(body.bytes.len());
        let answered = self
            .place(session, ctx, &limits, endpoint, &body.bytes)
            .await;
        let answered = answered.inspect_err(|e| note_shed(state, e))?;
        // No retry can need the body any more: its memory and budget go back now, before
        // the response streams.
        drop(body);
        let reply = Reply {
            request_id: &ctx.request_id,
            closing: state.draining(),
        };
        dispatch::finish(state, &limits, session, answered, reply).await
    }

    /// Parses a routed body and places the request, until its backend answers.
    async fn place(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        limits: &Limits,
        endpoint: Option<Endpoint>,
        body: &Bytes,
    ) -> Result<Answered, RouterError> {
        let state = &*self.state;
        let out = Outbound {
            head: headers::upstream_request(session.req_header()),
            body,
            request_id: &ctx.request_id,
        };
        let Some(endpoint) = endpoint else {
            let route = Route::AnyBackend;
            return dispatch::dispatch(state, limits, session, &out, route, &mut ctx.placed).await;
        };
        let parsed = request::parse(endpoint, body)?;
        let headers = &session.req_header().headers;
        let request = Request {
            model: parsed.model,
            text: &parsed.text,
            session: SessionKey::find(headers, &limits.session_headers, parsed.session),
        };
        ctx.text_len = parsed.text.len();
        let route = Route::Policy(&request);
        dispatch::dispatch(state, limits, session, &out, route, &mut ctx.placed).await
    }
}

/// Counts a request shed for overload.
fn note_shed(state: &State, error: &RouterError) {
    if let RouterError::Overloaded { shed, .. } = error {
        state.stats.shed(shed.label());
    }
}

/// Writes `error` as an OpenAI-style JSON response unless a response has started; returns
/// the status written, 0 when none.
async fn respond_error(session: &mut Session, error: &RouterError) -> u16 {
    let status = error.status();
    if status == 0 || session.response_written().is_some() {
        return 0;
    }
    let body = error.body();
    let Ok(head) = error_header(status, &body, error.retry_after()) else {
        return 0;
    };
    let downstream = session.as_downstream_mut();
    if let Err(e) = downstream.write_error_response(head, body).await {
        debug!("could not send error response: {e}");
    }
    status
}

fn error_header(status: u16, body: &Bytes, retry_after: Option<u64>) -> Result<ResponseHeader> {
    let mut head = ResponseHeader::build(status, Some(4))?;
    if let Some(secs) = retry_after {
        head.insert_header(http::header::RETRY_AFTER, secs)?;
    }
    head.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    head.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    head.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    Ok(head)
}

fn log_request(session: &Session, ctx: &Ctx, status: u16) {
    let elapsed = ctx.started.elapsed();
    let head = session.req_header();
    let (backend, outcome, matched) = match &ctx.placed {
        Some(p) => (
            p.backend.worker.url.as_str(),
            p.decision.outcome.label(),
            p.decision.matched,
        ),
        None => ("-", "-", 0),
    };
    let line = format_args!(
        "[{}] {} {} -> {backend} {outcome} matched {matched}/{} bytes, status {status}, {:.1} ms",
        ctx.request_id,
        head.method,
        head.uri.path(),
        ctx.text_len,
        ms(elapsed)
    );
    match &ctx.failure {
        Some(e) if e.status() >= 500 => warn!("{line}: {e}"),
        Some(e) => debug!("{line}: {e}"),
        None => debug!("{line}"),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
