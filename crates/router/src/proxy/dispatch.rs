//! Placing one request, in one loop: ready backends (waiting in the router's queue while
//! every one is at its limit, or for the first health checks right after a start) → the
//! ledger places it by the policy → the exchange sends it → outlier detection notes how it
//! ended → another backend while the attempt may be retried (nothing reached the first, or
//! a replayable request got no answer or a 5xx; within `retries` and the retry budget),
//! until a backend's response head is relayed. With a tenants file, a request stopped
//! before its answer for one that outranks it ([`crate::tenants::preempt`]) waits and is
//! placed again, as if it had just arrived.
//! Generic over the [`Exchange`], so that the loop is tested with a fake one.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use log::warn;
use opentelemetry::KeyValue;
use prefix_router_core::BackendId;
use prefix_router_core::flow::{AtHome, Gate, Wait};
use prefix_router_core::ledger::{self, Account, Cap, Placing, Seat};
use prefix_router_core::policy::{Candidate, Decision, Outcome, Request, Turn};
use prefix_router_core::units::TextBytes;
use smallvec::SmallVec;

use super::exchange::{Exchange, Failure};
use super::prepare;
use crate::admission::{Bounds, Left, Place, Queue, Retrying};
use crate::error::{RouterError, ShedReason};
use crate::fleet::{Backend, Ended, Fleet, Leg, Ready};
use crate::limits::Limits;
use crate::state::State;
use crate::stats::{Label, RetryReason};
use crate::tenants::preempt::Preemptible;
use crate::traces::RequestTrace;

/// Models named in a `model_required` answer at most.
const NAMED: usize = 8;

/// Bytes of an unknown model's name echoed in its `model_not_found` answer at most.
const NAME_SHOWN: usize = 256;

/// Longest wait for backends' first health checks before answering 503.
const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

/// How a request is placed.
pub enum Route<'r, 'a> {
    /// By the policy, on its routing text and session.
    Policy(&'r Request<'r, 'a>),
    /// On the least loaded backend (paths that are not routed on a prompt).
    AnyBackend,
}

impl Route<'_, '_> {
    /// Its routing text's size (none, placed on any backend).
    pub fn text(&self) -> TextBytes {
        match self {
            Route::Policy(request) => request.size(),
            Route::AnyBackend => TextBytes(0),
        }
    }

    /// The model the request names, if it names one.
    fn model(&self) -> Option<&[u8]> {
        match self {
            Route::Policy(request) if !request.model.is_empty() => Some(request.model),
            _ => None,
        }
    }

    /// The request placed on `backend` holds no KV there (refused, or failed).
    pub fn released(&self, state: &State, backend: BackendId) {
        if let Route::Policy(request) = self {
            state.selector.released(request.conversation(), backend);
        }
    }
}

/// The backend a request went to, and why.
pub struct Placed {
    /// The backend.
    pub backend: Arc<Backend>,
    /// The policy's decision.
    pub decision: Decision,
}

/// How dispatching ended: the last placement (for the access log), and the answer, or
/// why there is none.
pub struct Dispatched<A> {
    /// The last backend tried, if any.
    pub placed: Option<Placed>,
    /// Attempts retried on another backend.
    pub retries: usize,
    /// The answer.
    pub result: Result<Answered<A>, RouterError>,
}

/// A backend's answer, with the seat the request holds there until it ends.
pub struct Answered<A> {
    /// The answer (a response head to relay).
    pub answer: A,
    /// The request's seat on the backend.
    pub seat: Seat,
    /// The backend.
    pub backend: Arc<Backend>,
}

/// Sends the request of `exchange` where `route` says, retrying as `limits` allow, until a
/// backend's response head arrives; `trace` gets the wait and the first placement.
pub async fn run<E: Exchange>(
    state: &State,
    limits: &Limits,
    exchange: &mut E,
    route: &Route<'_, '_>,
    gate: Gate<'_>,
    trace: &RequestTrace,
) -> Dispatched<E::Answer> {
    let mut tried: SmallVec<[BackendId; 4]> = SmallVec::new();
    let mut placed = None;
    let mut preempted = false;
    let mut refused = Refusals::default();
    let mut last_error = RouterError::NoBackend;
    let mut retry = Retry {
        state,
        limits,
        replayable: exchange.replayable(),
        leg: exchange.leg(),
        budget: None,
    };
    let result = loop {
        let ready = match admitted(state, limits, exchange, route, &tried, gate, trace).await {
            Ok(ready) if ready.is_empty() => break Err(last_error),
            Ok(ready) => ready,
            Err(e) => break Err(e),
        };
        let cap = gate.cap(limits.max_inflight_per_backend);
        let (ready, cap) = reclaim_home(state, &gate, ready, route, cap);
        let Some((seat, backend)) = place(state, cap, &ready, route, trace) else {
            // Another request took the last slot since the backends were read.
            match refused.back_off(limits.queue_timeout).await {
                Ok(()) => continue,
                Err(e) => break Err(e),
            }
        };
        refused = Refusals::default();
        let decision = seat.decision();
        placed = Some(Placed {
            backend: Arc::clone(&backend),
            decision,
        });
        let sent = send(state, exchange, &gate, cap, &backend, &mut preempted).await;
        let (retried, error) = match sent {
            Err(Failure::Preempted) => continue,
            Ok(answer)
                if E::ended(&answer) == Ended::Sick
                    && retry.allows(RetryReason::Status, &tried, &backend) =>
            {
                note_exchange(state, limits, &backend, Ended::Sick);
                (
                    true,
                    RouterError::Upstream("the backend answered 5xx".into()),
                )
            }
            Ok(answer) => {
                break Ok(Answered {
                    answer,
                    seat,
                    backend,
                });
            }
            Err(failure) => {
                let failed = failure.error().is_upstream_fault();
                note_exchange(state, limits, &backend, ended(failed));
                let reason = match &failure {
                    Failure::Unsent(_) => Some(RetryReason::ConnectFailure),
                    Failure::Unanswered(_) => Some(RetryReason::Reset),
                    Failure::Final(_) | Failure::Preempted => None,
                };
                let retried = reason.is_some_and(|r| retry.allows(r, &tried, &backend));
                (retried, failure.into_error())
            }
        };
        route.released(state, backend.id);
        if !retried {
            break Err(error);
        }
        warn!("{}: {error}; trying another backend", backend.worker.url);
        tried.push(backend.id);
        last_error = error;
    };
    Dispatched {
        placed,
        retries: tried.len(),
        result,
    }
}

/// Placements refused in a row before each next one waits [`REFUSED_PAUSE`].
const REFUSED_IN_A_ROW: u32 = 8;

/// The pause before placing again after [`REFUSED_IN_A_ROW`] refusals.
const REFUSED_PAUSE: Duration = Duration::from_millis(1);

/// Placements refused in a row (a backend found open was full when placed on), and since
/// when: the loop must neither spin nor last, should the ledger's view and its placement
/// disagree.
#[derive(Default)]
struct Refusals {
    count: u32,
    since: Option<Instant>,
}

impl Refusals {
    /// After one more refusal: lets the other tasks run, and past [`REFUSED_IN_A_ROW`]
    /// pauses; pausing for longer than `timeout` (`queue_timeout`) ends the request as a
    /// wait in the queue would, with 503 `overloaded`.
    async fn back_off(&mut self, timeout: Duration) -> Result<(), RouterError> {
        self.count += 1;
        if self.count <= REFUSED_IN_A_ROW {
            tokio::task::yield_now().await;
            return Ok(());
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > timeout {
            let count = self.count;
            warn!("placement refused {count} times in a row; answering 503");
            return Err(RouterError::Overloaded {
                shed: ShedReason::QueueTimeout,
                retry_after: timeout.as_secs().max(1),
            });
        }
        tokio::time::sleep(REFUSED_PAUSE).await;
        Ok(())
    }
}

/// Sends the request of `exchange`, placed on `backend` under `cap` ([`Gate::placed`]):
/// one the reserve is kept for first stops those there that it outranks and that have no
/// answer yet; one it is not kept for may be stopped so until its answer, unless it was
/// once (`preempted`, set when it is; not when it was only taken back from the engine's
/// queue).
async fn send<E: Exchange>(
    state: &State,
    exchange: &mut E,
    gate: &Gate<'_>,
    cap: Cap,
    backend: &Backend,
    preempted: &mut bool,
) -> Result<E::Answer, Failure> {
    let preemptible = Preemptible::placed(gate, cap, backend.id, *preempted);
    let sent = exchange
        .send(backend, preemptible.as_ref().map(|p| p.stop()))
        .await;
    if let Err(Failure::Preempted) = sent {
        *preempted = !preemptible.as_ref().is_some_and(|p| p.taken_back());
        (state.tenancy).preempted(gate.flow.tenant, gate.flow.priority);
    }
    sent
}

/// Whether a failed attempt may be tried on another backend.
struct Retry<'s> {
    state: &'s State,
    limits: &'s Limits,
    replayable: bool,
    /// The leg of the request: another backend serving it must be ready.
    leg: Leg,
    /// The request's place in the retry budget, once it retried.
    budget: Option<Retrying<'s>>,
}

impl Retry<'_> {
    /// Whether an attempt on `backend` that failed for `reason`, after `tried`, may be
    /// tried again: `retry_on` names it, the request can be replayed where that matters,
    /// retries are left and another backend is ready. A 5xx that may not is relayed as it
    /// is.
    fn may(&self, reason: RetryReason, tried: &[BackendId], backend: &Backend) -> bool {
        let settings = &self.limits.retry;
        let on = match reason {
            RetryReason::ConnectFailure => settings.on.connect_failure,
            RetryReason::Reset => settings.on.reset && self.replayable,
            RetryReason::Status => settings.on.status && self.replayable,
        };
        if !on || tried.len() >= settings.max {
            return false;
        }
        let mut excluded: SmallVec<[BackendId; 4]> = SmallVec::from_slice(tried);
        excluded.push(backend.id);
        !self
            .state
            .fleet
            .ready(&excluded)
            .for_leg(self.leg)
            .is_empty()
    }

    /// Whether the attempt is retried: it [may](Retry::may) be, and the retry budget
    /// allows (a request takes its place in it once, at its first retry).
    fn allows(&mut self, reason: RetryReason, tried: &[BackendId], backend: &Backend) -> bool {
        if !self.may(reason, tried, backend) {
            return false;
        }
        let state = self.state;
        if self.budget.is_none() {
            self.budget = state.retry_budget.take(&self.limits.retry, state.active());
        }
        match self.budget {
            Some(_) => state.stats.retry(reason),
            None => state.stats.retry_budget_exhausted(),
        }
        self.budget.is_some()
    }
}

fn ended(failed: bool) -> Ended {
    if failed {
        Ended::Failed
    } else {
        Ended::Answered
    }
}

/// Places the request on one of `ready` open under `cap` through the ledger, its prompt
/// counted there until answered if the backend publishes its KV events
/// ([`crate::kv_events::Records::sent`]); `None` when a concurrent request took the slot
/// chosen.
fn place(
    state: &State,
    cap: Cap,
    ready: &Ready,
    route: &Route,
    trace: &RequestTrace,
) -> Option<(Seat, Arc<Backend>)> {
    let text = route.text();
    let cap = match route {
        Route::Policy(request) => cap.of_conversation(|| request.conversation()),
        Route::AnyBackend => cap,
    };
    let recorded = Cell::new(false);
    let choose = |candidates: &[Candidate], asking| match route {
        Route::Policy(request) => prepare::choose(state, request, asking, candidates, &recorded),
        Route::AnyBackend => Decision::new(
            state.ties.least_loaded(Turn::Take, candidates),
            Outcome::Balanced,
        ),
    };
    let Placing::Placed { seat, index } = ledger::place(&ready.accounts(), cap, text, choose)
    else {
        return None;
    };
    let decision = seat.decision();
    (state.stats).decision(decision.outcome, decision.matched, text);
    let backend = Arc::clone(ready.backend(index)?);
    if let Route::Policy(request) = route
        && let Some(prompt) = state.records.sent(request, backend.id)
    {
        seat.count_sent(prompt);
    }
    trace.placed(|| placement(state, route, &decision, &backend, recorded.get()));
    Some((seat, backend))
}

/// What the route span records of a placement.
fn placement(
    state: &State,
    route: &Route,
    decision: &Decision,
    backend: &Backend,
    recorded: bool,
) -> Vec<KeyValue> {
    let size = match route {
        Route::Policy(r) => r.prompt_size(),
        Route::AnyBackend => Default::default(),
    };
    let (matched, total, unit) = size.shown(decision.matched);
    let index = match route {
        Route::AnyBackend => "none",
        Route::Policy(_) if recorded => "kv_events",
        Route::Policy(r) if r.tokens.is_some() => "tokens",
        Route::Policy(_) => "text",
    };
    vec![
        KeyValue::new("prefix_router.policy", state.policy_name),
        KeyValue::new("prefix_router.outcome", decision.outcome.label()),
        KeyValue::new("prefix_router.prefix.matched", matched as i64),
        KeyValue::new("prefix_router.prefix.total", total as i64),
        KeyValue::new("prefix_router.prefix.unit", unit),
        KeyValue::new("prefix_router.index", index),
        KeyValue::new("prefix_router.backend", backend.authority.clone()),
    ]
}

/// The ready backends not tried yet, below their in-flight limit. Right after a start
/// or an upgrade no backend was checked yet: the first attempt waits for the first
/// checks rather than refuse. While every ready backend is at its limit, the request
/// waits in the router's queue, and is placed when one frees (by the policy at that
/// moment), in the queue's order. A request of a tenant below its fair share passes the
/// queue to a slot open for it (one the others keep in reserve).
async fn admitted<E: Exchange>(
    state: &State,
    limits: &Limits,
    exchange: &mut E,
    route: &Route<'_, '_>,
    tried: &[BackendId],
    gate: Gate<'_>,
    trace: &RequestTrace,
) -> Result<Ready, RouterError> {
    let fleet = &state.fleet;
    if tried.is_empty() && fleet.ready(tried).is_empty() && fleet.awaiting_first_check() {
        let checked = |f: &Fleet| !f.ready(&[]).is_empty() || !f.awaiting_first_check();
        fleet.wait_until(FIRST_CHECK_WAIT, checked).await;
    }
    let limit = limits.max_inflight_per_backend;
    let (subset, leg) = (exchange.subset(), exchange.leg());
    let within = |f: &Fleet| f.ready(tried).within(subset.as_deref()).for_leg(leg);
    let ready = match tried {
        [] => serving(within(fleet), route)?,
        _ => within(fleet).serving(route.model()),
    };
    if ready.is_empty() || wait(state, limits, &ready, &gate).is_none() {
        return Ok(ready);
    }
    let open = |ready: &Ready| ledger::open(&ready.accounts(), gate.cap(limit));
    let overloaded = |shed| RouterError::Overloaded {
        shed,
        retry_after: limits.queue_timeout.as_secs().max(1),
    };
    let promote_after = limits.queue_timeout / 2;
    let bounds = Bounds {
        all: limits.max_queued,
        per_tenant: limits.max_queued_per_tenant,
        per_priority: limits.max_queued_per_priority,
    };
    let place = (state.queue).join(bounds, gate, promote_after);
    let place = place.or_else(|| displaced(&state.queue, bounds, gate, promote_after));
    let place = place.ok_or_else(|| overloaded(ShedReason::QueueFull))?;
    make_room(state, &gate, &ready, route);
    let (started, since) = (Instant::now(), SystemTime::now());
    let wait = place.wait(fleet, started + limits.queue_timeout, |f| {
        Some(within(f).serving(route.model())).filter(open)
    });
    let waited = tokio::select! {
        biased;
        ready = wait => Ok(ready),
        gone = exchange.client_gone() => Err(gone),
    };
    state.admission.waited(started.elapsed());
    state.tenancy.waited(gate.flow.tenant, started.elapsed());
    trace.waited(since);
    waited?.map_err(|left| match left {
        Left::TimedOut => overloaded(ShedReason::QueueTimeout),
        Left::Shed => overloaded(ShedReason::QueueFull),
    })
}

/// A place for `gate`'s request that the queue, full of waiters it may not shed,
/// refused: past the bound [`Gate::past_bound`] gives it (unbounded once it stopped a
/// request it outranks; else, for `high`, by those it outranks, all answered), for the
/// slot one of them frees.
fn displaced<'q>(
    queue: &'q Queue,
    bounds: Bounds,
    gate: Gate,
    promote_after: Duration,
) -> Option<Place<'q>> {
    if queue.len() < bounds.all {
        return None;
    }
    let all = gate.past_bound(bounds.all);
    queue.join(Bounds { all, ..bounds }, gate, promote_after)
}

/// A request the reserve is kept for, waiting for a slot, makes room where it would go
/// ([`Gate::make_room`]).
fn make_room(state: &State, gate: &Gate, ready: &Ready, route: &Route) {
    let accounts = ready.accounts();
    let unbounded = |cap| unbounded(state, cap, &accounts, route);
    gate.make_room(&accounts, route.text(), unbounded);
}

/// A request the reserve is kept for whose conversation's home is not open to it stays
/// there ([`Gate::reclaim_home`]): only the home, under the cap that lets it in. Else
/// `ready` and `cap` are left as they were.
fn reclaim_home(state: &State, gate: &Gate, ready: Ready, route: &Route, cap: Cap) -> (Ready, Cap) {
    let home = {
        let accounts = ready.accounts();
        let unbounded = || unbounded(state, cap, &accounts, route);
        let home = gate.reclaim_home(&accounts, cap, unbounded);
        home.and_then(|(i, cap)| Some((accounts.get(i)?.id, cap)))
    };
    match home {
        Some((id, cap)) => (ready.only(id), cap),
        None => (ready, cap),
    }
}

/// How the request stays home ([`Gate::at_home`]), among `ready`.
pub fn at_home(
    state: &State,
    gate: &Gate,
    ready: &Ready,
    route: &Route,
    cap: Cap,
) -> Option<AtHome> {
    let accounts = ready.accounts();
    gate.at_home(&accounts, cap, || unbounded(state, cap, &accounts, route))
}

/// Where the policy would place the request under `cap` among `accounts` if every one
/// had room (asked without remembering anything): the position and the decision.
pub fn unbounded(
    state: &State,
    cap: Cap,
    accounts: &[&Arc<Account>],
    route: &Route,
) -> Option<(usize, Decision)> {
    let Route::Policy(request) = route else {
        return None;
    };
    let asking = Request {
        explain: true,
        ..**request
    };
    let choose = |candidates: &[Candidate], how| {
        prepare::choose(state, &asking, how, candidates, &Cell::new(false))
    };
    ledger::unbounded(accounts, cap, choose)
}

/// Those of `ready` (every ready backend) that serve the request's model: 404
/// `model_not_found` when no backend of the fleet, ready or not, serves it and the name
/// is needed to choose among the fleet's models ([`Ready::serving`]: a fleet of one model
/// takes any name), 400 `model_required` for a request without a model when the fleet
/// serves several. A model whose backends are all down leaves none ready (503).
pub fn serving(ready: Ready, route: &Route) -> Result<Ready, RouterError> {
    let Route::Policy(_) = route else {
        return Ok(ready);
    };
    let Some(model) = route.model() else {
        let models = ready.fleet_models();
        let mut base = models
            .iter()
            .filter(|m| m.parent.is_none())
            .map(|m| m.id.as_str());
        return match (base.next(), base.next()) {
            (Some(_), Some(_)) => {
                let mut names: Vec<&str> =
                    (models.iter().take(NAMED)).map(|m| m.id.as_str()).collect();
                let more = format!("{} more", models.len().saturating_sub(NAMED));
                if models.len() > NAMED {
                    names.push(&more);
                }
                Err(RouterError::ModelRequired(names.join(", ")))
            }
            _ => Ok(ready),
        };
    };
    if !ready.known(model) {
        // Echoed in the answer: at most NAME_SHOWN bytes of whatever the client sent.
        let shown = &model[..model.len().min(NAME_SHOWN)];
        let name = String::from_utf8_lossy(shown).into_owned();
        return Err(RouterError::ModelNotFound(name));
    }
    Ok(ready.serving(Some(model)))
}

/// Why a request at `gate` would wait before being placed on one of `ready` now
/// ([`Gate::wait`]); `None` when it would go at once.
pub fn wait(state: &State, limits: &Limits, ready: &Ready, gate: &Gate) -> Option<Wait> {
    let limit = limits.max_inflight_per_backend;
    gate.wait(&ready.accounts(), limit, state.queue.first_priority())
}

/// Outlier detection counts how an exchange with `backend` ended; the fleet keeps its
/// share open.
pub fn note_exchange(state: &State, limits: &Limits, backend: &Backend, ended: Ended) {
    let settings = &limits.outlier;
    let may_eject = || state.fleet.may_eject(settings);
    if let Some(e) = backend.record_exchange(ended, settings, may_eject) {
        let (url, why, secs) = (&backend.worker.url, e.reason.label(), e.time.as_secs());
        warn!("{url} ejected for {secs} s ({why} in a row)");
    }
}

#[cfg(test)]
mod tests;
