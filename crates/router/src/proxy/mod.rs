//! The Pingora `ProxyHttp` service. It only wires phases together: `request_filter` serves
//! the whole request on one straight path (read the body, parse it, [`dispatch`] it to a
//! backend, relay the answer, note what happened) and writes the error response when it
//! fails; `logging` writes one line per request.

pub(crate) mod body;
pub(crate) mod disaggregate;
pub mod dispatch;
pub(crate) mod exchange;
pub(crate) mod headers;
pub mod prepare;
pub(crate) mod relay;
pub mod steps;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use log::{debug, warn};
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use prefix_router_core::request::Endpoint;
use prefix_router_core::units::{PromptSize, TextBytes};

use crate::endpoints;
use crate::error::RouterError;
use crate::fleet::{Ended, Leg};
use crate::limits::Limits;
use crate::responses;
use crate::state::{Active, State};
use crate::stats::Label;
use crate::tenants::{Charge, Priority};
use crate::traces::{Ending, RequestTrace};
use disaggregate::Handoff;
use dispatch::{Answered, Dispatched, Placed, Route};
use prepare::Prepared;
use relay::{Answering, Reply, Upstream};
use steps::{Finished, PlacedRequest};

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

/// Per-request state, for the access log and the trace.
pub struct Ctx {
    _active: Active,
    request_id: String,
    started: Instant,
    /// The request's spans (none without tracing).
    trace: RequestTrace,
    /// Attempts retried on another backend.
    retries: usize,
    /// The routed endpoint asked for, if any.
    endpoint: Option<Endpoint>,
    /// The prompt's size (0 bytes for paths not routed on a prompt).
    prompt: PromptSize,
    placed: Option<Placed>,
    /// Its priority (`x-priority`), once its tenant is known.
    priority: Option<Priority>,
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
            trace: RequestTrace::default(),
            retries: 0,
            endpoint: None,
            prompt: PromptSize::default(),
            placed: None,
            priority: None,
            failure: None,
        }
    }

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    /// Serves the request; a failure is answered here, as its JSON error. A response cut
    /// after it started (or a client gone) is handed to Pingora as an error instead, so
    /// that it aborts the connection rather than end the response as if complete.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let Err(e) = self.serve(session, ctx).await else {
            return Ok(true);
        };
        if let RouterError::Overloaded { shed, .. } = &e {
            self.state.admission.shed(*shed);
        }
        let answered = respond_error(session, &e).await > 0;
        ctx.failure = Some(e);
        match answered {
            true => Ok(true),
            false => Error::e_explain(ErrorType::InternalError, "response cut short"),
        }
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut Ctx) -> Result<Box<HttpPeer>> {
        Error::e_explain(
            ErrorType::InternalError,
            "requests are relayed in request_filter",
        )
    }

    /// Pingora's own failures (a malformed head, say), answered as JSON errors; the
    /// router's were answered in `request_filter` (or cannot be, once a response started).
    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let failure =
            (ctx.failure).get_or_insert_with(|| RouterError::Upstream(crate::error::reason(e)));
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
        self.state.stats.request(ctx.endpoint, status, backend);
        log_request(session, ctx, status);
        let authority = ctx.placed.as_ref().map(|p| p.backend.authority.as_str());
        ctx.trace.end(Ending {
            status,
            error: ctx.failure.as_ref(),
            backend: authority,
            retries: ctx.retries,
        });
    }
}

impl Router {
    /// Serves one request: reads its body, places it, relays the answer.
    async fn serve(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), RouterError> {
        let state = &*self.state;
        let live = state.live();
        let limits = &live.limits;
        let head = session.req_header();
        ctx.request_id = headers::request_id(head);
        let started =
            (SystemTime::now().checked_sub(ctx.started.elapsed())).unwrap_or_else(SystemTime::now);
        ctx.trace = state.tracing.request(&head.headers, started);
        let path = head.uri.path();
        let endpoint = (head.method == Method::POST)
            .then(|| Endpoint::from_path(path))
            .flatten();
        let route = endpoint.map(|_| path);
        (ctx.trace).request_line(head.method.as_str(), route, path, &ctx.request_id);
        if let Some(probe) = endpoints::probe(&head.method, path) {
            let (status, body) = steps::probe_answer(state, probe);
            return answer_json(session, status, &body).await;
        }
        if endpoints::is_admin(path) {
            return Err(RouterError::NotFound(path.to_string()));
        }
        let identity = steps::identify(state, &live, &head.headers)?;
        ctx.priority = Some(identity.priority);
        if head.method == Method::GET
            && path == "/v1/models"
            && let Some(body) = steps::models_answer(state)
        {
            return answer_json(session, 200, &body).await;
        }
        ctx.endpoint = endpoint;
        let path_named = responses::path_id(path).map(str::to_string);
        let reading = SystemTime::now();
        let body = body::read(session, &body::Reading::new(limits, &state.budget)).await;
        ctx.trace
            .body_read(reading, body.as_ref().map(|b| b.bytes.len()));
        let body = body?;
        state.stats.body(body.bytes.len());
        ctx.trace.routing();
        let bytes = body.bytes.clone();
        let headers = &session.req_header().headers;
        let prepared = steps::prepare(state, limits, endpoint, headers, &bytes).await?;
        if let Some(p) = &prepared {
            ctx.prompt = p.size();
        }
        let estimate = ctx.prompt.tokens().0 as u64;
        let charge =
            (state.tenancy.admit(&identity, estimate)).map_err(RouterError::RateLimited)?;
        let named = (prepared.as_ref().and_then(Prepared::previous_response))
            .or(path_named.as_deref().map(str::as_bytes));
        let subset = named
            .map(|id| responses::pinned(&state.responses, &state.fleet, id))
            .transpose()?
            .flatten();
        let request = prepared.as_ref().map(|p| p.request(false));
        let route = request.as_ref().map_or(Route::AnyBackend, Route::Policy);
        let method = &session.req_header().method;
        let replayable = endpoint.is_some() || method == Method::GET || method == Method::HEAD;
        let mut head = headers::upstream_request(session.req_header());
        if let Some(priority) = steps::engine_priority(&identity) {
            headers::set_engine_priority(&mut head, priority);
        }
        let mut upstream = Upstream {
            replayable,
            head,
            session: &mut *session,
            connector: &state.connector,
            body: Some(body),
            request_id: &ctx.request_id,
            timeouts: &limits.exchange,
            trace: &ctx.trace,
            subset,
            leg: Leg::Whole,
        };
        let gate = steps::gate(state, &identity, ctx.prompt.tokens());
        // Counted in its tenant's share until the response ends.
        let _share = gate.control.enter(&gate.flow);
        let handoff = (&route, gate);
        let dispatched = match disaggregate::prefill(
            state,
            limits,
            endpoint,
            &mut upstream,
            handoff,
            &ctx.trace,
        )
        .await
        {
            Ok(Handoff::Refused { status, body }) => {
                drop(upstream);
                return answer_bytes(session, status, body).await;
            }
            Ok(Handoff::Whole | Handoff::Local | Handoff::Decode) => {
                dispatch::run(state, limits, &mut upstream, &route, gate, &ctx.trace).await
            }
            Err(e) => Dispatched {
                placed: None,
                retries: 0,
                result: Err(e),
            },
        };
        let leg = upstream.leg;
        drop(upstream);
        if let Err(RouterError::Overloaded { shed, .. }) = &dispatched.result {
            state.tenancy.shed(&identity, shed.label());
        }
        ctx.placed = dispatched.placed;
        ctx.retries = dispatched.retries;
        let answered = dispatched.result?;
        let reply = Reply {
            request_id: &ctx.request_id,
            closing: state.draining(),
            learns_id: (endpoint == Some(Endpoint::Responses)).then_some(&state.responses),
            leg,
        };
        relay(
            state,
            limits,
            session,
            answered,
            reply,
            &route,
            charge.as_ref(),
        )
        .await
    }
}

/// Relays the answered response to the client and notes how it went.
async fn relay(
    state: &State,
    limits: &Limits,
    session: &mut Session,
    answered: Answered<Answering>,
    reply: Reply<'_>,
    route: &Route<'_, '_>,
    charge: Option<&Charge>,
) -> Result<(), RouterError> {
    let Answered {
        answer,
        seat,
        backend,
    } = answered;
    let answered = answer.ended();
    // A refused request holds no KV there: forgotten before the client sees the refusal.
    let refused = !answer.succeeded();
    if refused {
        route.released(state, backend.id);
    }
    let exchanged = (answer)
        .relay(&state.connector, session, &seat, reply, &limits.exchange)
        .await;
    let result = exchanged.result.as_ref().map_err(|f| f.error()).copied();
    let ended = match result {
        Err(e) if e.is_upstream_fault() => Ended::Failed,
        _ => answered,
    };
    let status = exchanged.trace.as_ref().map_or(0, |t| t.status);
    let held = PlacedRequest {
        backend: &backend,
        seat: &seat,
        charge,
    };
    let finished = Finished {
        ended,
        released: refused,
        served: result.is_ok() && (200..300).contains(&status),
        trace: exchanged.trace.as_ref(),
        leg: reply.leg,
    };
    steps::note_end(state, limits, held, route, finished);
    exchanged.result.map_err(|f| f.into_error())
}

/// Writes `error` as a JSON response in the API's shape unless a response has started, and
/// closes the client's connection after it (the request's body may be unread); returns the
/// status written, 0 when none.
async fn respond_error(session: &mut Session, error: &RouterError) -> u16 {
    session.set_keepalive(None);
    let status = error.status();
    if status == 0 || session.response_written().is_some() {
        return 0;
    }
    let body = error.body_for(session.req_header().uri.path());
    let Ok(mut head) = error_header(status, &body, error.retry_after()) else {
        return 0;
    };
    for (name, value) in error.headers() {
        // Names and values are made here, of ASCII letters, digits and dashes.
        let _ = head.insert_header(name, value);
    }
    let downstream = session.as_downstream_mut();
    if let Err(e) = downstream.write_error_response(head, body).await {
        debug!("could not send error response: {e}");
    }
    status
}

/// Writes `body` as the whole response, with `status`.
async fn answer_json(
    session: &mut Session,
    status: u16,
    body: &serde_json::Value,
) -> Result<(), RouterError> {
    answer_bytes(session, status, Bytes::from(body.to_string())).await
}

/// Writes `body`, JSON, as the whole response, with `status`.
async fn answer_bytes(session: &mut Session, status: u16, body: Bytes) -> Result<(), RouterError> {
    let gone = |e: Box<Error>| RouterError::ClientGone(crate::error::reason(&e));
    let head = error_header(status, &body, None).map_err(gone)?;
    let downstream = session.as_downstream_mut();
    downstream
        .write_error_response(head, body)
        .await
        .map_err(gone)
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
        None => ("-", "-", TextBytes(0)),
    };
    let (matched, size, unit) = ctx.prompt.shown(matched);
    let priority = ctx.priority.map_or("-", Label::label);
    let line = format_args!(
        "[{}] {} {} {priority} -> {backend} {outcome} matched {matched}/{size} {unit}, status {status}, {:.1} ms",
        ctx.request_id,
        head.method,
        head.uri.path(),
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
