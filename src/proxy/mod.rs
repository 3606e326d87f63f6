//! The Pingora `ProxyHttp` service. It only wires phases together: `request_filter` reads the
//! body, asks `request` for the routing text and the selector for a backend, and relays the
//! exchange itself (see [`relay`]); `fail_to_proxy` is the one place errors become HTTP
//! responses; `logging` writes one line per request.

mod body;
mod headers;
mod relay;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use log::{debug, warn};
use pingora_core::connectors::http::Connector;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::config::{Config, Timeouts};
use crate::error::RouterError;
use crate::fleet::Fleet;
use crate::policy::{Decision, Outcome, Request, Selector, least_loaded};
use crate::request::{self, Endpoint, SessionHeaders, SessionKey};
use relay::{Exchange, Placement};

/// Everything requests share.
pub struct State {
    /// Backends.
    pub fleet: Arc<Fleet>,
    /// Policy with session affinity.
    pub selector: Selector,
    connector: Connector,
    timeouts: Timeouts,
    retries: usize,
    max_body_bytes: usize,
    session_headers: SessionHeaders,
}

impl State {
    /// State for `config` over `fleet`.
    pub fn new(config: &Config, fleet: Arc<Fleet>, selector: Selector) -> Self {
        State {
            fleet,
            selector,
            connector: Connector::new(None),
            timeouts: config.timeouts.clone(),
            retries: config.retries,
            max_body_bytes: config.max_body_bytes,
            session_headers: SessionHeaders::new(config.session_headers.clone()),
        }
    }
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
    started: Instant,
    text_len: usize,
    placement: Option<Placement>,
    failure: Option<RouterError>,
}

#[async_trait]
impl ProxyHttp for Router {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            started: Instant::now(),
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
        Error::e_explain(ErrorType::InternalError, "requests are relayed in request_filter")
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
        log_request(session, ctx);
    }
}

impl Router {
    async fn serve(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), RouterError> {
        let state = &*self.state;
        let head = session.req_header();
        let endpoint = (head.method == Method::POST)
            .then(|| Endpoint::from_path(head.uri.path()))
            .flatten();
        let body = body::read(session, state.max_body_bytes, state.timeouts.client_read).await?;
        match endpoint {
            Some(endpoint) => self.routed(session, ctx, endpoint, &body).await,
            None => {
                let any = |c: &[_]| Decision::new(least_loaded(c), Outcome::Balanced);
                self.relay(session, ctx, &body, any).await
            }
        }
    }

    async fn routed(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        endpoint: Endpoint,
        body: &Bytes,
    ) -> Result<(), RouterError> {
        let parsed = request::parse(endpoint, body)?;
        let headers = &session.req_header().headers;
        let key = SessionKey::find(headers, &self.state.session_headers, parsed.session);
        ctx.text_len = parsed.text.len();
        let request = Request {
            model: parsed.model,
            text: &parsed.text,
            session: key,
        };
        let choose = |c: &[_]| self.state.selector.select(&request, c);
        self.relay(session, ctx, body, choose).await
    }

    async fn relay(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        body: &Bytes,
        choose: impl Fn(&[crate::policy::Candidate]) -> Decision,
    ) -> Result<(), RouterError> {
        let state = &*self.state;
        let req = headers::upstream_request(session.req_header());
        let exchange = Exchange {
            connector: &state.connector,
            fleet: &state.fleet,
            timeouts: &state.timeouts,
            retries: state.retries,
            text_len: ctx.text_len,
        };
        let placed = |p: Placement| ctx.placement = Some(p);
        exchange.run(session, &req, body, choose, placed).await
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

fn log_request(session: &Session, ctx: &Ctx) {
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    let elapsed = ctx.started.elapsed();
    let head = session.req_header();
    let (backend, outcome, matched) = match &ctx.placement {
        Some(p) => (p.backend.worker.url.as_str(), p.decision.outcome.label(), p.decision.matched),
        None => ("-", "-", 0),
    };
    let line = format_args!(
        "{} {} -> {backend} {outcome} matched {matched}/{} bytes, status {status}, {:.1} ms",
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
