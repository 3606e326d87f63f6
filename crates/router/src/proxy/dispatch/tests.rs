//! The dispatch loop driven by a fake exchange over a fleet of backends nobody listens
//! on: retries, queueing, the client leaving, and the first health checks, without a
//! socket.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use prefix_router_core::clock::Monotonic;
use prefix_router_core::flow::TenantId;
use prefix_router_core::ledger::{self, Placing, UpkeepSchedule};
use prefix_router_core::policy::{self, PolicyParams};
use prefix_router_core::tree::TreeConfig;
use tokio::sync::Notify;

use super::*;
use crate::admission::AdmissionMetrics;
use crate::fleet::Worker;
use crate::kv_events::{KvEventMetrics, Records};
use crate::limits::{Current, LiveLimits};
use crate::state::Parts;
use crate::stats::{Registry, Stats};
use crate::tokens::{TokenMetrics, Tokenizers};

/// What the fake's next attempt does.
enum Step {
    Answer,
    /// Answered with this status.
    Status(u16),
    /// Refused before anything reached the backend.
    Refused,
    /// Closed after the request was sent, before any answer.
    Cut,
    /// No answer until stopped by a request that outranks it (answered at once when it
    /// cannot be).
    UntilStopped,
}

/// An exchange that answers as scripted, and whose client leaves after `gone_after`.
struct Fake {
    steps: VecDeque<Step>,
    sent: Vec<BackendId>,
    gone_after: Option<Duration>,
    replayable: bool,
}

impl Fake {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Fake {
            steps: steps.into_iter().collect(),
            sent: Vec::new(),
            gone_after: None,
            replayable: false,
        }
    }

    fn replayable(steps: impl IntoIterator<Item = Step>) -> Self {
        Fake {
            replayable: true,
            ..Fake::new(steps)
        }
    }
}

#[async_trait]
impl Exchange for Fake {
    /// The backend that answered, and its status.
    type Answer = (BackendId, u16);

    async fn send(
        &mut self,
        backend: &Backend,
        stop: Option<&Notify>,
    ) -> Result<(BackendId, u16), Failure> {
        self.sent.push(backend.id);
        let error = |what: &str| RouterError::Upstream(what.into());
        match self.steps.pop_front().unwrap_or(Step::Answer) {
            Step::UntilStopped if let Some(stop) = stop => {
                stop.notified().await;
                Err(Failure::Preempted)
            }
            Step::Answer | Step::UntilStopped => Ok((backend.id, 200)),
            Step::Status(status) => Ok((backend.id, status)),
            Step::Refused => Err(Failure::Unsent(error("connection refused"))),
            Step::Cut => Err(Failure::Unanswered(error(
                "reset after the request was sent",
            ))),
        }
    }

    fn replayable(&self) -> bool {
        self.replayable
    }

    fn ended(answer: &(BackendId, u16)) -> Ended {
        Ended::of_status(answer.1, false)
    }

    async fn client_gone(&mut self) -> RouterError {
        match self.gone_after {
            Some(after) => {
                tokio::time::sleep(after).await;
                RouterError::ClientGone("closed".into())
            }
            None => std::future::pending().await,
        }
    }
}

/// `n` backends, health-checked when `checked`, placed by `round_robin`.
fn state(n: u16, checked: bool) -> State {
    let fleet = Arc::new(Fleet::new());
    let members: Vec<(Worker, SocketAddr)> = (1..=n)
        .map(|port| {
            let url = format!("http://127.0.0.1:{port}");
            (
                Worker::parse(&url).unwrap(),
                SocketAddr::from(([127, 0, 0, 1], port)),
            )
        })
        .collect();
    fleet.replace(&members, Duration::from_secs(1));
    for b in fleet.snapshot().backends.iter().filter(|_| checked) {
        b.mark_checked();
    }
    let live = Current::new(LiveLimits::default());
    let registry = Registry::new();
    let params = PolicyParams {
        tunables: live.tunables(),
        tree: TreeConfig::default(),
        seed: 0,
        clock: Arc::new(Monotonic::default()),
        calibrate: true,
        session_ttl: Duration::from_secs(60),
        conversations: None,
    };
    State::new(Parts {
        fleet,
        selector: policy::choose("round_robin").unwrap().build(&params),
        policy_name: "round_robin",
        upkeep: UpkeepSchedule::new(Duration::from_secs(60)),
        live,
        stats: Arc::new(Stats::new(&registry, "round_robin")),
        admission: AdmissionMetrics::new(&registry),
        tokenizers: Tokenizers::none(TokenMetrics::new(&registry)),
        records: Arc::new(Records::new(KvEventMetrics::new(&registry))),
        tenancy: crate::tenants::Tenancy::new(&registry),
        tracing: crate::traces::Tracing::off(),
        response_ttl: Duration::from_secs(60),
    })
}

/// In-flight limit `limit` per backend, a queue wait of `queue_timeout`.
fn limits(limit: usize, queue_timeout: Duration) -> Limits {
    Limits {
        max_inflight_per_backend: limit,
        queue_timeout,
        ..Limits::default()
    }
}

/// A seat on the first backend, as another request in flight would hold.
fn occupy(state: &State) -> Seat {
    let snapshot = state.fleet.snapshot();
    let first = |_: &[Candidate], _| Decision::new(0, Outcome::Balanced);
    match ledger::place(&snapshot.accounts(), 0, TextBytes(0), first) {
        Placing::Placed { seat, .. } => seat,
        other => panic!("{other:?}"),
    }
}

/// Dispatches a request placed on any backend, without a trace.
async fn dispatch(state: &State, limits: &Limits, fake: &mut Fake) -> Dispatched<(BackendId, u16)> {
    run(
        state,
        limits,
        fake,
        &Route::AnyBackend,
        Gate::default(),
        &RequestTrace::default(),
    )
    .await
}

#[tokio::test]
async fn a_refused_connection_is_retried_on_another_backend() {
    let state = state(2, true);
    let mut fake = Fake::new([Step::Refused, Step::Answer]);
    let limits = Limits::default();
    let dispatched = dispatch(&state, &limits, &mut fake).await;
    let answered = dispatched.result.unwrap();
    assert_eq!(fake.sent.len(), 2);
    assert_ne!(fake.sent[0], fake.sent[1]);
    assert_eq!(answered.answer, (fake.sent[1], 200));
    assert_eq!(dispatched.placed.unwrap().backend.id, fake.sent[1]);
    assert_eq!(state.stats.totals().retries, 1);
    assert_eq!(
        answered.seat.account().load(),
        1,
        "the answer holds its seat"
    );
}

#[tokio::test]
async fn a_request_that_cannot_be_replayed_is_not_retried_once_it_may_have_reached_a_backend() {
    let state = state(2, true);
    let mut fake = Fake::new([Step::Cut]);
    let dispatched = dispatch(&state, &Limits::default(), &mut fake).await;
    assert!(matches!(dispatched.result, Err(RouterError::Upstream(_))));
    assert_eq!(fake.sent.len(), 1);
    let seats: usize = state
        .fleet
        .snapshot()
        .backends
        .iter()
        .map(|b| b.load())
        .sum();
    assert_eq!(seats, 0, "a failed attempt leaves no load behind");
}

#[tokio::test]
async fn retries_end_with_the_last_error_when_every_backend_refuses() {
    let state = state(2, true);
    let mut fake = Fake::new([Step::Refused, Step::Refused, Step::Refused]);
    let dispatched = dispatch(&state, &Limits::default(), &mut fake).await;
    assert!(matches!(dispatched.result, Err(RouterError::Upstream(_))));
    assert_eq!(fake.sent.len(), 2, "each backend once");
}

#[tokio::test]
async fn a_queued_request_times_out_and_leaves_the_queue() {
    let state = state(1, true);
    let _busy = occupy(&state);
    let limits = limits(1, Duration::from_millis(100));
    let mut fake = Fake::new([]);
    let dispatched = dispatch(&state, &limits, &mut fake).await;
    let shed = match dispatched.result {
        Err(RouterError::Overloaded { shed, .. }) => shed,
        other => panic!("{:?}", other.err()),
    };
    assert_eq!(shed, ShedReason::QueueTimeout);
    assert!(fake.sent.is_empty());
    assert!(state.queue.is_empty());
}

#[tokio::test]
async fn a_queued_request_takes_the_slot_freed() {
    let state = state(1, true);
    let busy = occupy(&state);
    let limits = limits(1, Duration::from_secs(10));
    let mut fake = Fake::new([]);
    let freeing = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(busy);
    };
    let (dispatched, ()) = tokio::join!(dispatch(&state, &limits, &mut fake), freeing);
    assert!(dispatched.result.is_ok());
    assert_eq!(fake.sent.len(), 1);
}

#[tokio::test]
async fn a_client_gone_while_queued_leaves_the_queue() {
    let state = state(1, true);
    let _busy = occupy(&state);
    let limits = limits(1, Duration::from_secs(10));
    let mut fake = Fake::new([]);
    fake.gone_after = Some(Duration::from_millis(20));
    let started = std::time::Instant::now();
    let dispatched = dispatch(&state, &limits, &mut fake).await;
    assert!(matches!(dispatched.result, Err(RouterError::ClientGone(_))));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(state.queue.is_empty());
    assert!(fake.sent.is_empty());
}

#[tokio::test]
async fn the_first_request_waits_for_the_first_health_check() {
    let state = state(1, false);
    let checking = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        state.fleet.snapshot().backends[0].observe_check(true, 1, 1);
        state.fleet.readiness_changed();
    };
    let mut fake = Fake::new([]);
    let limits = Limits::default();
    let (dispatched, ()) = tokio::join!(dispatch(&state, &limits, &mut fake), checking);
    assert!(dispatched.result.is_ok());
    assert_eq!(fake.sent.len(), 1);
}

#[tokio::test]
async fn a_replayable_request_answered_nothing_or_5xx_is_retried_elsewhere() {
    let state = state(3, true);
    let mut fake = Fake::replayable([Step::Cut, Step::Status(500), Step::Answer]);
    let dispatched = dispatch(&state, &Limits::default(), &mut fake).await;
    let answered = dispatched.result.unwrap();
    assert_eq!(answered.answer.1, 200);
    assert_eq!(fake.sent.len(), 3);
    assert_eq!(dispatched.retries, 2);
    assert_eq!(state.stats.totals().retries, 2);
}

#[tokio::test]
async fn a_5xx_is_relayed_as_it_is_when_no_other_backend_is_left() {
    let state = state(2, true);
    let mut fake = Fake::replayable([Step::Status(503), Step::Status(502)]);
    let dispatched = dispatch(&state, &Limits::default(), &mut fake).await;
    assert_eq!(
        dispatched.result.unwrap().answer.1,
        502,
        "the last backend's answer"
    );
    assert_eq!(fake.sent.len(), 2);
    let client_faults = Fake::replayable([Step::Status(429), Step::Status(400)]);
    let mut fake = client_faults;
    let dispatched = dispatch(&state, &Limits::default(), &mut fake).await;
    assert_eq!(
        dispatched.result.unwrap().answer.1,
        429,
        "429 is not retried"
    );
}

#[tokio::test]
async fn retries_stop_when_the_budget_is_spent() {
    let state = state(3, true);
    let limits = Limits {
        retry: crate::limits::RetrySettings {
            min_concurrency: 1,
            budget_percent: 0,
            ..Default::default()
        },
        ..Limits::default()
    };
    let _other = state.retry_budget.take(&limits.retry, 0).unwrap();
    let mut fake = Fake::replayable([Step::Refused, Step::Answer]);
    let dispatched = dispatch(&state, &limits, &mut fake).await;
    assert!(matches!(dispatched.result, Err(RouterError::Upstream(_))));
    assert_eq!(fake.sent.len(), 1, "no retry beyond the budget");
}

#[tokio::test]
async fn sick_answers_in_a_row_eject_a_backend_and_the_fleet_keeps_one_open() {
    let state = state(2, true);
    let limits = Limits::default();
    for _ in 0..20 {
        let mut fake = Fake::new([Step::Status(500)]);
        let answered = dispatch(&state, &limits, &mut fake).await.result.unwrap();
        let backend = Arc::clone(&answered.backend);
        drop(answered);
        note_exchange(&state, &limits, &backend, Ended::Sick);
    }
    let backends = state.fleet.snapshot();
    let ejected = backends.backends.iter().filter(|b| b.is_ejected()).count();
    assert_eq!(ejected, 1, "one of two may be ejected, never both");
    assert_eq!(state.fleet.ready(&[]).len(), 1);
}

/// One backend that ran 4 requests when it last queued, 3 of them in flight now (the
/// seats), and tenant `a` holding 4 requests in `shares` (its shares): one slot left.
fn one_slot_left(
    shares: &crate::tenants::Shares,
) -> (State, Vec<Seat>, Vec<crate::tenants::Share<'_>>) {
    use crate::tenants::Priority;
    use prefix_router_core::policy::Published;
    let state = state(1, true);
    let published = Published {
        running: 4,
        waiting: 1,
        kv_usage: 0.5,
    };
    state.fleet.snapshot().accounts()[0].learn_hold(published);
    let running = (0..3).map(|_| occupy(&state)).collect();
    let a = (0..4)
        .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
        .collect();
    (state, running, a)
}

/// Dispatches a request of `tenant` (weighed by `shares`, leaving `standing` slots) placed
/// on any backend, without a trace.
async fn as_tenant(
    state: &State,
    limits: &Limits,
    fake: &mut Fake,
    shares: &crate::tenants::Shares,
    tenant: &str,
    standing: usize,
) -> Dispatched<(BackendId, u16)> {
    let tenant = TenantId::new(tenant);
    let ticket = Gate {
        flow: prefix_router_core::flow::order::QueueTicket {
            tenant: &tenant,
            ..Default::default()
        },
        control: shares,
        standing,
        ..Gate::default()
    };
    let trace = RequestTrace::default();
    run(state, limits, fake, &Route::AnyBackend, ticket, &trace).await
}

/// Tenant `a`'s request on [`one_slot_left`] (200 ms of queue timeout), then, once it
/// waits in the router's queue (checked), tenant `b`'s; `b` counts in the shares from the
/// start, or from its request when `b_arrives`. Both leave `standing` slots. Returns both
/// results and whether `a`'s request never reached a backend.
async fn a_then_b(
    standing: usize,
    b_arrives: bool,
) -> (
    Result<Answered<(BackendId, u16)>, RouterError>,
    Result<Answered<(BackendId, u16)>, RouterError>,
    bool,
    String,
) {
    use crate::tenants::{Priority, Shares};
    let shares = Shares::default();
    let (state, _running, _a) = one_slot_left(&shares);
    let enter = || shares.enter(&TenantId::new("b"), 1, Priority::Normal);
    let _b = (!b_arrives).then(enter);
    let limits = limits(0, Duration::from_millis(200));
    let (mut heavy, mut light) = (Fake::new([Step::Answer]), Fake::new([Step::Answer]));
    let a = as_tenant(&state, &limits, &mut heavy, &shares, "a", standing);
    let b = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(state.queue.len(), 1, "a waits: its last slot is left free");
        let _b = b_arrives.then(enter);
        as_tenant(&state, &limits, &mut light, &shares, "b", standing).await
    };
    let (a, b) = tokio::join!(a, b);
    let metrics = String::from_utf8(state.stats.render()).unwrap();
    (a.result, b.result, heavy.sent.is_empty(), metrics)
}

#[tokio::test]
async fn a_tenant_below_its_share_passes_the_queue_to_the_slot_kept_for_it() {
    let (a, b, a_unsent, metrics) = a_then_b(0, false).await;
    assert!(b.is_ok(), "b took the kept slot past a");
    assert!(matches!(
        a,
        Err(RouterError::Overloaded {
            shed: ShedReason::QueueTimeout,
            ..
        })
    ));
    assert!(a_unsent);
    let waited = "prefix_router_tenant_queue_wait_seconds_count{tenant=\"a\"} 1";
    assert!(metrics.contains(waited), "a's wait is counted: {metrics}");
}

#[tokio::test]
async fn a_standing_slot_waits_free_for_a_tenant_that_was_not_active() {
    let (a, b, a_unsent, _) = a_then_b(1, true).await;
    assert!(b.is_ok(), "b, arriving, took the standing slot");
    assert!(a.is_err(), "a never got it");
    assert!(a_unsent);
}

#[tokio::test]
async fn a_light_tenants_request_stops_an_unanswered_heavy_one_which_is_placed_again() {
    use crate::tenants::{Priority, Shares};
    let shares = Shares::default();
    let state = state(1, true);
    let _a: Vec<_> = (0..4)
        .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
        .collect();
    let _b = shares.enter(&TenantId::new("b"), 1, Priority::Normal);
    let limits = Limits::default();
    let mut heavy = Fake::new([Step::UntilStopped, Step::UntilStopped]);
    let mut light = Fake::new([Step::UntilStopped]);
    let a = as_tenant(&state, &limits, &mut heavy, &shares, "a", 0);
    let b = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = as_tenant(&state, &limits, &mut light, &shares, "b", 0).await;
        let mut again = Fake::new([]);
        let c = as_tenant(&state, &limits, &mut again, &shares, "b", 0).await;
        (b, c)
    };
    let (a, (b, _)) = tokio::join!(a, b);
    assert!(b.result.is_ok(), "b is never stopped: it outranks a");
    assert!(
        a.result.is_ok(),
        "a, stopped, was placed again and answered"
    );
    assert_eq!(
        heavy.sent.len(),
        2,
        "stopped once only: b's second request left it"
    );
    assert_eq!(a.retries, 0, "not a retry");
    let metrics = String::from_utf8(state.stats.render()).unwrap();
    let stopped = "prefix_router_tenant_preempted_total{priority=\"normal\",tenant=\"a\"} 1";
    assert!(metrics.contains(stopped), "{metrics}");
}

#[tokio::test]
async fn a_waiting_higher_priority_stops_an_unanswered_lower_one_and_takes_its_slot() {
    use crate::tenants::{Priority, Shares};
    let shares = Shares::default();
    let state = state(1, true);
    let limits = limits(1, Duration::from_secs(5));
    let p = TenantId::new("p");
    let at = |priority| Gate {
        flow: prefix_router_core::flow::order::QueueTicket {
            tenant: &p,
            priority,
            ..Default::default()
        },
        control: &shares,
        ..Gate::default()
    };
    let _low_share = shares.enter(&TenantId::new("p"), 1, Priority::Low);
    let mut low = Fake::new([Step::UntilStopped, Step::Answer]);
    let mut high = Fake::new([Step::Answer]);
    let trace = RequestTrace::default();
    let low_run = run(
        &state,
        &limits,
        &mut low,
        &Route::AnyBackend,
        at(Priority::Low),
        &trace,
    );
    let high_run = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _high_share = shares.enter(&TenantId::new("p"), 1, Priority::High);
        let trace = RequestTrace::default();
        let ticket = at(Priority::High);
        let high = run(
            &state,
            &limits,
            &mut high,
            &Route::AnyBackend,
            ticket,
            &trace,
        )
        .await;
        // Its response ended: its seat frees.
        high.result.is_ok()
    };
    let both = async { tokio::join!(low_run, high_run) };
    let (low_done, high_ok) = tokio::time::timeout(Duration::from_secs(3), both)
        .await
        .expect("high took the slot rather than wait for low's answer");
    assert!(high_ok);
    assert!(low_done.result.is_ok(), "low, stopped, was placed again");
    assert_eq!(low.sent.len(), 2, "low was sent twice");
}

#[tokio::test]
async fn placements_refused_in_a_row_pause_and_end_after_the_queue_timeout() {
    let mut refused = Refusals::default();
    for _ in 0..REFUSED_IN_A_ROW {
        assert!(
            refused.back_off(Duration::ZERO).await.is_ok(),
            "a race: at once"
        );
    }
    let ended = refused.back_off(Duration::ZERO).await;
    assert!(matches!(
        ended,
        Err(RouterError::Overloaded {
            shed: ShedReason::QueueTimeout,
            ..
        })
    ));
    let mut refused = Refusals::default();
    let started = Instant::now();
    for _ in 0..REFUSED_IN_A_ROW + 5 {
        assert!(refused.back_off(Duration::from_secs(60)).await.is_ok());
    }
    assert!(
        started.elapsed() >= 5 * REFUSED_PAUSE,
        "the last five paused"
    );
}
