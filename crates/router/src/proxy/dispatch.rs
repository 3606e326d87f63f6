//! Placing one request, in one loop: ready backends → choose → acquire → exchange → note
//! health and stats → retry elsewhere or finish. A failed attempt is retried on another
//! backend only while nothing can have reached the first (see [`Failure`]).

use std::sync::Arc;
use std::time::Duration;

use log::warn;
use pingora_proxy::Session;
use prefix_router_core::BackendId;
use prefix_router_core::policy::{Candidate, Decision, Outcome, Request};
use smallvec::SmallVec;

use super::Limits;
use super::relay::{self, Exchanged, Failure, Outbound};
use crate::error::RouterError;
use crate::fleet::{Backend, Fleet, Ready};
use crate::state::State;

/// Longest wait for backends' first health checks before answering 503.
const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

/// How a request is placed.
pub enum Route<'r, 'a> {
    /// By the policy, on its routing text and session.
    Policy(&'r Request<'r, 'a>),
    /// On the least loaded backend (paths that are not routed on a prompt).
    AnyBackend,
}

/// The backend a request went to, and why.
pub struct Placed {
    /// The backend.
    pub backend: Arc<Backend>,
    /// The policy's decision.
    pub decision: Decision,
}

/// Sends `out` where `route` says, retrying as `limits` allow; `placed` holds the last
/// placement (for the access log). `text_len` is the routing text's length in bytes.
pub async fn dispatch(
    state: &State,
    limits: &Limits,
    session: &mut Session,
    out: &Outbound<'_>,
    route: Route<'_, '_>,
    placed: &mut Option<Placed>,
) -> Result<(), RouterError> {
    let text_len = match &route {
        Route::Policy(request) => request.text.len(),
        Route::AnyBackend => 0,
    };
    let mut tried: SmallVec<[BackendId; 4]> = SmallVec::new();
    let mut last_error = RouterError::NoBackend;
    loop {
        let ready = ready(state, &tried).await;
        if ready.candidates.is_empty() {
            return Err(last_error);
        }
        let decision = choose(state, &route, &ready.candidates);
        let backend = ready
            .backend(decision.index)
            .ok_or(RouterError::NoBackend)?;
        let load = backend.acquire(text_len, text_len.saturating_sub(decision.matched));
        state.stats.decision(
            state.policy_name,
            decision.outcome.label(),
            decision.matched,
            text_len,
        );
        *placed = Some(Placed {
            backend: Arc::clone(backend),
            decision,
        });
        let exchanged =
            relay::exchange(&state.connector, session, &load, out, &limits.exchange).await;
        let predicted = matches!(route, Route::Policy(_)).then_some(decision.matched);
        note(state, limits, backend, &exchanged, predicted);
        match exchanged.result {
            Ok(()) => return Ok(()),
            Err(Failure::Retryable(e)) if tried.len() < limits.retries => {
                warn!("{}: {e}; trying another backend", backend.worker.url);
                state.stats.retry();
                tried.push(backend.id);
                last_error = e;
            }
            Err(Failure::Retryable(e) | Failure::Final(e)) => return Err(e),
        }
    }
}

/// The ready backends not tried yet. Right after a start or an upgrade no backend was
/// checked yet: the first attempt waits for the first checks rather than refuse.
async fn ready(state: &State, tried: &[BackendId]) -> Ready {
    let ready = state.fleet.ready(tried);
    if ready.candidates.is_empty() && tried.is_empty() && state.fleet.awaiting_first_check() {
        let checked = |f: &Fleet| !f.ready(&[]).candidates.is_empty() || !f.awaiting_first_check();
        state.fleet.wait_until(FIRST_CHECK_WAIT, checked).await;
        return state.fleet.ready(tried);
    }
    ready
}

fn choose(state: &State, route: &Route, candidates: &[Candidate]) -> Decision {
    match route {
        Route::Policy(request) => state.selector.select(request, candidates),
        Route::AnyBackend => Decision::new(state.ties.least_loaded(candidates), Outcome::Balanced),
    }
}

/// Passive health counts transport failures (not the client's, not statuses); stats get
/// what was seen of the response, and the policy what the backend reported it had cached
/// against what it `predicted` (routed requests).
fn note(
    state: &State,
    limits: &Limits,
    backend: &Backend,
    exchanged: &Exchanged,
    predicted: Option<usize>,
) {
    let failed = exchanged
        .result
        .as_ref()
        .is_err_and(|f| f.error().is_upstream_fault());
    if backend.record_exchange(!failed, limits.passive_failures) {
        warn!(
            "{} failed {} exchanges in a row; out until its next passed health check",
            backend.worker.url, limits.passive_failures
        );
    }
    if let Some(trace) = &exchanged.trace {
        if let (Some(predicted), Some(usage)) = (predicted, trace.usage) {
            state.selector.observe(backend.id, predicted, usage.cached);
        }
        let url = backend.worker.url.as_str();
        state
            .stats
            .exchange(url, trace.first_byte, trace.total, trace.usage);
    }
}
