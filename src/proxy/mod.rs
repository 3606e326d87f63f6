//! The Pingora `ProxyHttp` service. It only wires phases together: `request_filter` reads the
//! body, asks `request` for the routing text and the selector for a backend, and relays the
//! exchange itself (see `relay.rs`); `fail_to_proxy` is the one place errors become HTTP
//! responses; `logging` writes one line per request.

mod body;
mod headers;
mod relay;
mod state;

pub use state::{Active, Limits, State};

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

use crate::error::RouterError;
use crate::policy::{Candidate, Decision, Outcome, Request, least_loaded};
use crate::request::{self, Endpoint, SessionKey};
use relay::{Exchange, Placement};

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
    placement: Option<Placement>,
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
            placement: None,
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
            .get_or_insert_with(|| RouterError::Upstream(e.to_string()));
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
        let backend = ctx
            .placement
            .as_ref()
            .map_or("-", |p| p.backend.worker.url.as_str());
        let status_label = if status == 0 {
            "none".to_string()
        } else {
            status.to_string()
        };
        let labels = [ctx.route, status_label.as_str(), backend];
        self.state.stats.requests.with_label_values(&labels).inc();
        log_request(session, ctx, status);
    }
}

/// Paths served only by the admin listener; the data plane answers 404 to them.
const ADMIN_PATHS: [&str; 7] = [
    "/metrics",
    "/stats",
    "/workers",
    "/list_workers",
    "/add_worker",
    "/remove_worker",
    "/reload",
];

impl Router {
    async fn serve(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), RouterError> {
        let state = &*self.state;
        let limits = state.limits();
        let head = session.req_header();
        ctx.request_id = headers::request_id(head);
        let path = head.uri.path();
        if ADMIN_PATHS.contains(&path) {
            return Err(RouterError::NotFound(path.to_string()));
        }
        let endpoint = (head.method == Method::POST)
            .then(|| Endpoint::from_path(path))
            .flatten();
        ctx.route = endpoint.map_or("other", Endpoint::label);
        let t = &limits.timeouts;
        let body = body::read(session, limits.max_body_bytes, t.client_read, t.client_body).await?;
        state.stats.body_bytes.observe(body.len() as f64);
        match endpoint {
            Some(endpoint) => self.routed(session, ctx, &limits, endpoint, &body).await,
            None => {
                let any = |c: &[_]| Decision::new(least_loaded(c), Outcome::Balanced);
                self.relay(session, ctx, &limits, &body, any).await
            }
        }
    }

    async fn routed(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        limits: &Limits,
        endpoint: Endpoint,
        body: &Bytes,
    ) -> Result<(), RouterError> {
        let parsed = request::parse(endpoint, body)?;
        let headers = &session.req_header().headers;
        let key = SessionKey::find(headers, &limits.session_headers, parsed.session);
        ctx.text_len = parsed.text.len();
        let request = Request {
            model: parsed.model,
            text: &parsed.text,
            session: key,
        };
        let choose = |c: &[_]| self.state.selector.select(&request, c);
        self.relay(session, ctx, limits, body, choose).await
    }

    async fn relay(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        limits: &Limits,
        body: &Bytes,
        choose: impl Fn(&[Candidate]) -> Decision,
    ) -> Result<(), RouterError> {
        let state = &*self.state;
        let req = headers::upstream_request(session.req_header());
        let exchange = Exchange {
            connector: &state.connector,
            fleet: &state.fleet,
            stats: &state.stats,
            timeouts: &limits.timeouts,
            retries: limits.retries,
            text_len: ctx.text_len,
            closing: state.draining(),
            passive_failures: limits.passive_failures,
            request_id: &ctx.request_id,
        };
        let text_len = ctx.text_len;
        let placed = |p: Placement| {
            count_decision(state, &p, text_len);
            ctx.placement = Some(p);
        };
        exchange.run(session, &req, body, choose, placed).await
    }
}

fn count_decision(state: &State, placement: &Placement, text_len: usize) {
    let outcome = placement.decision.outcome.label();
    let stats = &state.stats;
    stats
        .decisions
        .with_label_values(&[state.policy_name, outcome])
        .inc();
    stats
        .matched_bytes
        .inc_by(placement.decision.matched as u64);
    stats.text_bytes.inc_by(text_len as u64);
}

/// Writes `error` as an OpenAI-style JSON response unless a response has started; returns
/// the status written, 0 when none.
async fn respond_error(session: &mut Session, error: &RouterError) -> u16 {
    let status = error.status();
    if status == 0 || session.response_written().is_some() {
        return 0;
    }
    let body = error.body();
    let Ok(head) = error_header(status, &body) else {
        return 0;
    };
    let downstream = session.as_downstream_mut();
    if let Err(e) = downstream.write_error_response(head, body).await {
        debug!("could not send error response: {e}");
    }
    status
}

fn error_header(status: u16, body: &Bytes) -> Result<ResponseHeader> {
    let mut head = ResponseHeader::build(status, Some(3))?;
    head.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    head.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    head.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    Ok(head)
}

fn log_request(session: &Session, ctx: &Ctx, status: u16) {
    let elapsed = ctx.started.elapsed();
    let head = session.req_header();
    let (backend, outcome, matched) = match &ctx.placement {
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
