//! Placing one request, in one loop: ready backends (waiting in the router's queue while
//! every one is at its limit) → choose → acquire → send → note health → retry elsewhere,
//! until a backend's response head arrives; then, apart, relaying that response. A failed
//! attempt is retried on another backend only while nothing can have reached the first
//! (see [`Failure`]). Once the head arrived no retry can need the body, so the caller
//! drops it before the response streams.

use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use pingora_proxy::Session;
use prefix_router_core::BackendId;
use prefix_router_core::policy::{Candidate, Decision, Outcome, Request};
use smallvec::SmallVec;

use super::Limits;
use super::relay::{self, Answering, Failure, Outbound, Reply, Trace};
use crate::error::{RouterError, Shed};
use crate::fleet::{Backend, Fleet, LoadGuard, Ready};
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

/// A request whose backend answered with a response head; its body is needed no more.
pub struct Answered {
    answering: Answering,
    load: LoadGuard,
    /// What the policy predicted the backend held, for routed requests.
    predicted: Option<usize>,
}

/// Sends `out` where `route` says, retrying as `limits` allow, until a backend's response
/// head arrives; `placed` holds the last placement (for the access log).
pub async fn dispatch(
    state: &State,
    limits: &Limits,
    session: &mut Session,
    out: &Outbound<'_>,
    route: Route<'_, '_>,
    placed: &mut Option<Placed>,
) -> Result<Answered, RouterError> {
    let text_len = match &route {
        Route::Policy(request) => request.text.len(),
        Route::AnyBackend => 0,
    };
    let mut tried: SmallVec<[BackendId; 4]> = SmallVec::new();
    let mut last_error = RouterError::NoBackend;
    loop {
        let ready = admitted(state, limits, session, &tried).await?;
        if ready.candidates.is_empty() {
            return Err(last_error);
        }
        let decision = choose(state, &route, &ready.candidates);
        let backend = ready
            .backend(decision.index)
            .ok_or(RouterError::NoBackend)?;
        let prefill = text_len.saturating_sub(decision.matched);
        let limit = limits.max_inflight_per_backend;
        let Some(load) = backend.acquire_below(limit, text_len, prefill) else {
            // Another request took the last slot since the candidates were read.
            continue;
        };
        (state.stats).decision(
            state.policy_name,
            decision.outcome.label(),
            decision.matched,
            text_len,
        );
        *placed = Some(Placed {
            backend: Arc::clone(backend),
            decision,
        });
        let predicted = matches!(route, Route::Policy(_)).then_some(decision.matched);
        let failure =
            match relay::send(&state.connector, session, &load, out, &limits.exchange).await {
                Ok(answering) => {
                    return Ok(Answered {
                        answering,
                        load,
                        predicted,
                    });
                }
                Err(failure) => failure,
            };
        note_health(limits, backend, Err(failure.error()));
        match failure {
            Failure::Retryable(e) if tried.len() < limits.retries => {
                warn!("{}: {e}; trying another backend", backend.worker.url);
                state.stats.retry();
                tried.push(backend.id);
                last_error = e;
            }
            Failure::Retryable(e) | Failure::Final(e) => return Err(e),
        }
    }
}

/// Relays the answered response to the client and notes how it went.
pub async fn finish(
    state: &State,
    limits: &Limits,
    session: &mut Session,
    answered: Answered,
    reply: Reply<'_>,
) -> Result<(), RouterError> {
    let Answered {
        answering,
        load,
        predicted,
    } = answered;
    let exchanged = answering
        .relay(&state.connector, session, &load, reply, &limits.exchange)
        .await;
    let backend = load.backend();
    note_health(
        limits,
        backend,
        exchanged.result.as_ref().map_err(Failure::error).copied(),
    );
    if let Some(trace) = &exchanged.trace {
        note_response(state, backend, trace, predicted);
    }
    exchanged.result.map_err(Failure::into_error)
}

/// The ready backends not tried yet, below their in-flight limit. Right after a start
/// or an upgrade no backend was checked yet: the first attempt waits for the first
/// checks rather than refuse. While every ready backend is at its limit, the request
/// waits in the router's queue, and is placed when one frees (by the policy at that
/// moment), first come first served.
async fn admitted(
    state: &State,
    limits: &Limits,
    session: &mut Session,
    tried: &[BackendId],
) -> Result<Ready, RouterError> {
    let fleet = &state.fleet;
    if fleet.ready(tried).candidates.is_empty() && tried.is_empty() && fleet.awaiting_first_check()
    {
        let checked = |f: &Fleet| !f.ready(&[]).candidates.is_empty() || !f.awaiting_first_check();
        fleet.wait_until(FIRST_CHECK_WAIT, checked).await;
    }
    let limit = limits.max_inflight_per_backend;
    let ready = fleet.ready(tried);
    if limit == 0 || ready.candidates.is_empty() {
        return Ok(ready);
    }
    let below = ready.below(limit);
    if !below.candidates.is_empty() && state.queue.is_empty() {
        return Ok(below);
    }
    let queued = state
        .queue
        .join(limits.max_queued)
        .ok_or(RouterError::Overloaded {
            shed: Shed::QueueFull,
            retry_after: retry_after(limits.queue_timeout),
        })?;
    let deadline = Instant::now() + limits.queue_timeout;
    let started = Instant::now();
    let wait = queued.wait(fleet, deadline, |f| {
        let below = f.ready(tried).below(limit);
        (!below.candidates.is_empty()).then_some(below)
    });
    let waited = relay::until_client_gone(session, wait).await;
    state.stats.queued(started.elapsed());
    waited?.ok_or(RouterError::Overloaded {
        shed: Shed::QueueTimeout,
        retry_after: retry_after(limits.queue_timeout),
    })
}

/// When to come back after being shed from the queue: its timeout, at least a second.
fn retry_after(timeout: Duration) -> u64 {
    timeout.as_secs().max(1)
}

fn choose(state: &State, route: &Route, candidates: &[Candidate]) -> Decision {
    match route {
        Route::Policy(request) => state.selector.select(request, candidates),
        Route::AnyBackend => Decision::new(state.ties.least_loaded(candidates), Outcome::Balanced),
    }
}

/// Passive health counts transport failures (not the client's, not statuses).
fn note_health(limits: &Limits, backend: &Backend, result: Result<(), &RouterError>) {
    let failed = result.is_err_and(|e| e.is_upstream_fault());
    if backend.record_exchange(!failed, limits.passive_failures) {
        warn!(
            "{} failed {} exchanges in a row; out until its next passed health check",
            backend.worker.url, limits.passive_failures
        );
    }
}

/// Stats get what was seen of the response, and the policy what the backend reported it
/// had cached against what it `predicted`.
fn note_response(state: &State, backend: &Backend, trace: &Trace, predicted: Option<usize>) {
    if let (Some(predicted), Some(usage)) = (predicted, trace.usage) {
        state.selector.observe(backend.id, predicted, usage.cached);
    }
    let url = backend.worker.url.as_str();
    (state.stats).exchange(url, trace.first_byte, trace.total, trace.usage);
}
