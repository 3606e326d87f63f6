//! Scheduling: open-loop arrivals (trace timestamps or agent session starts,
//! divided by `--speedup`), closed-loop turns inside a session (the next turn
//! goes a think time after the previous response, or after the previous send
//! for a turn that overlaps), all capped by `--concurrency`.
//!
//! Requests over the cap wait in FIFO order. Latency (TTFT, end-to-end) is
//! measured from when a request was actually sent; how late it was sent
//! relative to its schedule (waiting for a slot, or a late timer) is recorded
//! separately as the send lag.
//!
//! If the caller drops the run (the receiving end closes), the dispatcher
//! stops starting sessions and each session stops after its current request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, sleep_until};

use super::client::{self, ExchangeResult};
use super::plan::Plan;
use super::text::BodyStyle;

/// Header carrying the session id (with `--send-session-header`).
pub const SESSION_HEADER: &str = "x-session-id";

/// How to run a plan.
#[derive(Debug, Clone)]
pub(crate) struct RunSettings {
    /// Full URLs requests are posted to, in turn (as a round-robin balancer in front of
    /// router replicas would).
    pub(crate) endpoints: Vec<String>,
    /// Model name and streaming.
    pub(crate) style: BodyStyle,
    /// Schedule compression factor (> 0).
    pub(crate) speedup: f64,
    /// Maximum requests in flight (>= 1).
    pub(crate) concurrency: usize,
    /// Stop after this many requests.
    pub(crate) max_requests: Option<usize>,
    /// Stop sending after this long.
    pub(crate) duration: Option<Duration>,
    /// Send `x-session-id`.
    pub(crate) send_session: bool,
    /// Send again a request answered 429 with `Retry-After`, after it.
    pub(crate) retry_rate_limited: bool,
    /// Headers sent with every request (API key, priority).
    pub(crate) headers: Vec<(&'static str, String)>,
}

/// One request's result.
#[derive(Debug, Clone)]
pub struct RequestOutcome {
    /// Session index in the plan.
    pub session: u32,
    /// Turn index in the session.
    pub turn: u32,
    /// When it was sent, from the start of the run.
    pub sent: Duration,
    /// Time from the scheduled send to the actual send.
    pub lag: Duration,
    /// Time from send to the end of the answer.
    pub e2e: Duration,
    /// What came back.
    pub exchange: ExchangeResult,
}

/// All outcomes of a run and its wall time.
#[derive(Debug)]
pub struct RunResult {
    /// In completion order.
    pub outcomes: Vec<RequestOutcome>,
    /// From the first scheduled arrival to the last completion.
    pub elapsed: Duration,
}

struct RunCtx {
    client: reqwest::Client,
    settings: RunSettings,
    plan: Arc<Plan>,
    t0: Instant,
    deadline: Option<Instant>,
    budget: AtomicUsize,
    slots: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<RequestOutcome>,
    /// The next endpoint's turn.
    turn: AtomicUsize,
}

/// Runs `plan`, calling `on_outcome` as each request completes.
pub(crate) async fn run(
    client: reqwest::Client,
    settings: RunSettings,
    plan: Arc<Plan>,
    mut on_outcome: impl FnMut(&RequestOutcome),
) -> RunResult {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    let ctx = Arc::new(RunCtx {
        client,
        deadline: settings.duration.map(|d| t0 + d),
        budget: AtomicUsize::new(settings.max_requests.unwrap_or(usize::MAX)),
        slots: Arc::new(Semaphore::new(settings.concurrency.max(1))),
        settings,
        plan,
        t0,
        tx,
        turn: AtomicUsize::new(0),
    });
    tokio::spawn(dispatch(ctx));
    let mut outcomes = Vec::new();
    while let Some(o) = rx.recv().await {
        on_outcome(&o);
        outcomes.push(o);
    }
    RunResult {
        outcomes,
        elapsed: t0.elapsed(),
    }
}

/// Starts each session at its arrival time, in order.
async fn dispatch(ctx: Arc<RunCtx>) {
    for si in 0..ctx.plan.sessions.len() {
        let ready = ctx.t0 + ctx.scaled(ctx.plan.sessions[si].start_ms);
        if ctx.expired(ready) || ctx.tx.is_closed() {
            break;
        }
        sleep_until(ready).await;
        let Some(permit) = ctx.slot().await else {
            break;
        };
        tokio::spawn(session(ctx.clone(), si, ready, permit));
    }
}

/// Sends a session's turns in order: each a think time after the previous answer, or,
/// for a turn that overlaps, after the previous send; a turn that waits waits for every
/// answer of its session.
async fn session(ctx: Arc<RunCtx>, si: usize, first_ready: Instant, permit: OwnedSemaphorePermit) {
    let mut first = Some(permit);
    let (mut ready, mut last_send) = (first_ready, first_ready);
    let mut answers = tokio::task::JoinSet::new();
    for (ti, turn) in ctx.plan.sessions[si].turns.iter().enumerate() {
        let permit = match first.take() {
            Some(p) => p,
            None => {
                ready = if turn.overlaps {
                    last_send + ctx.scaled(turn.think_ms)
                } else {
                    if !all_delivered(&mut answers).await {
                        return;
                    }
                    Instant::now() + ctx.scaled(turn.think_ms)
                };
                if ctx.expired(ready) || ctx.tx.is_closed() {
                    break;
                }
                sleep_until(ready).await;
                match ctx.slot().await {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        last_send = Instant::now();
        let ctx = Arc::clone(&ctx);
        answers.spawn(async move {
            let outcome = ctx.send(si, ti, ready).await;
            drop(permit);
            ctx.tx.send(outcome).is_ok()
        });
    }
    all_delivered(&mut answers).await;
}

/// Waits for a session's requests in flight; false when a result could not be delivered
/// (the run was dropped).
async fn all_delivered(answers: &mut tokio::task::JoinSet<bool>) -> bool {
    let mut delivered = true;
    while let Some(sent) = answers.join_next().await {
        delivered &= sent.unwrap_or(false);
    }
    delivered
}

impl RunCtx {
    /// A schedule offset in trace ms, divided by the speedup.
    fn scaled(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms / 1000.0 / self.settings.speedup).max(0.0))
    }

    fn expired(&self, at: Instant) -> bool {
        self.deadline.is_some_and(|d| at >= d)
    }

    /// Waits for a concurrency slot, then takes one request from the budget;
    /// `None` once the budget or the duration is spent.
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        let permit = self.slots.clone().acquire_owned().await.ok()?;
        if self.expired(Instant::now()) {
            return None;
        }
        self.budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(1))
            .ok()?;
        Some(permit)
    }

    async fn send(&self, si: usize, ti: usize, ready: Instant) -> RequestOutcome {
        let session = &self.plan.sessions[si];
        let body = self.plan.body(&self.settings.style, &session.turns[ti]);
        // Sent again on a 429: shared, not copied.
        let body = bytes::Bytes::from(body);
        let endpoints = &self.settings.endpoints;
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % endpoints.len().max(1);
        let request = || {
            let url = endpoints.get(turn).map_or("", String::as_str);
            let mut req = (self.client.post(url))
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let (true, Some(id)) = (self.settings.send_session, &session.id) {
                req = req.header(SESSION_HEADER, &**id);
            }
            for (name, value) in &self.settings.headers {
                req = req.header(*name, value);
            }
            req
        };
        let stream = self.settings.style.stream();
        let mut sent = Instant::now();
        let mut exchange = client::exchange(request(), stream, sent).await;
        while let Some(wait) = exchange
            .retry_after
            .filter(|_| self.settings.retry_rate_limited)
        {
            if self.expired(Instant::now() + wait) || self.tx.is_closed() {
                break;
            }
            tokio::time::sleep(wait).await;
            sent = Instant::now();
            exchange = client::exchange(request(), stream, sent).await;
        }
        RequestOutcome {
            session: si as u32,
            turn: ti as u32,
            sent: sent.saturating_duration_since(self.t0),
            lag: sent.saturating_duration_since(ready),
            e2e: sent.elapsed(),
            exchange,
        }
    }
}
