//! The engine task: runs one [`EngineCore`] against the wall clock.
//!
//! For: mapping simulated time to real time (`real = simulated / time_scale`),
//! feeding the core with submissions and aborts from HTTP handlers, sleeping until
//! its next event, and telling each handler when its first token is out and when it
//! finished. One task per instance with one timer, not a task or timer per token.
//! Not for: scheduling decisions (see `engine`) or response formatting (see `http`).

use std::sync::Arc;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::{Duration, Instant, sleep_until};

use super::engine::{EngineCore, EngineRequest, Output};
use super::kv_events::Publisher;
use super::metrics::Metrics;

/// Maps simulated seconds since the instance started to real instants.
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    start: Instant,
    scale: f64,
}

impl SimClock {
    /// A clock starting now that runs `time_scale` simulated seconds per real second.
    pub fn new(time_scale: f64) -> Self {
        Self {
            start: Instant::now(),
            scale: time_scale,
        }
    }

    /// Simulated seconds elapsed.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.scale
    }

    /// The real instant of simulated time `sim` (seconds).
    pub fn instant(&self, sim: f64) -> Instant {
        self.start + self.real(sim)
    }

    /// The real duration of a simulated one of `sim` seconds.
    pub fn real(&self, sim: f64) -> Duration {
        Duration::try_from_secs_f64(sim / self.scale).unwrap_or(Duration::MAX / 4)
    }
}

/// What a handler hears about its request.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The first token is out (now, at `first_at`); later tokens follow every `interval`.
    FirstToken {
        cached_tokens: usize,
        first_at: Instant,
        interval: Duration,
    },
    /// All output tokens are out.
    Finished,
    /// The request can never fit in the cache.
    Rejected,
}

enum EngineCommand {
    Submit(EngineRequest, UnboundedSender<EngineEvent>),
    Abort(u64),
}

/// Sends requests to the engine task; cheap to clone.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: UnboundedSender<EngineCommand>,
}

impl std::fmt::Debug for EngineCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineCommand::Submit(request, _) => write!(f, "Submit({})", request.id),
            EngineCommand::Abort(id) => write!(f, "Abort({id})"),
        }
    }
}

impl EngineHandle {
    /// Submits a request; its events arrive on the returned receiver. The returned
    /// [`SimTicket`] aborts the request when dropped before [`SimTicket::complete`].
    /// `None` when the engine task has stopped.
    pub fn submit(
        &self,
        request: EngineRequest,
    ) -> Option<(SimTicket, UnboundedReceiver<EngineEvent>)> {
        let (tx, rx) = unbounded_channel();
        let id = request.id;
        self.tx.send(EngineCommand::Submit(request, tx)).ok()?;
        Some((
            SimTicket {
                id,
                tx: self.tx.clone(),
                done: false,
            },
            rx,
        ))
    }
}

/// Aborts its request in the engine when dropped, unless completed first.
#[derive(Debug)]
pub struct SimTicket {
    id: u64,
    tx: UnboundedSender<EngineCommand>,
    done: bool,
}

impl SimTicket {
    /// Marks the request finished, so dropping the ticket sends nothing.
    pub fn complete(&mut self) {
        self.done = true;
    }
}

impl Drop for SimTicket {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(EngineCommand::Abort(self.id));
        }
    }
}

/// Starts the engine task. It stops when every [`EngineHandle`] and [`SimTicket`] is gone.
pub fn spawn(
    core: EngineCore,
    metrics: Arc<Metrics>,
    clock: SimClock,
    publisher: Option<Publisher>,
) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = unbounded_channel();
    let task = Driver {
        core,
        metrics,
        clock,
        rx,
        waiters: Default::default(),
        publisher,
    };
    (EngineHandle { tx }, tokio::spawn(task.run()))
}

struct Driver {
    core: EngineCore,
    metrics: Arc<Metrics>,
    clock: SimClock,
    rx: UnboundedReceiver<EngineCommand>,
    waiters: std::collections::HashMap<u64, UnboundedSender<EngineEvent>>,
    /// Where the cache's changes go, one batch per step, when the instance publishes.
    publisher: Option<Publisher>,
}

impl Driver {
    async fn run(mut self) {
        loop {
            let deadline = self.core.next_deadline();
            let wake = deadline.map(|at| self.clock.instant(at));
            tokio::select! {
                command = self.rx.recv() => {
                    let Some(command) = command else { break };
                    self.core.advance(self.clock.now());
                    self.apply(command);
                    while let Ok(command) = self.rx.try_recv() {
                        self.apply(command);
                    }
                }
                () = sleep_opt(wake) => {
                    // Never less than the deadline, so float rounding cannot spin.
                    let now = self.clock.now().max(deadline.unwrap_or(0.0));
                    self.core.advance(now);
                }
            }
            self.dispatch();
        }
    }

    fn apply(&mut self, command: EngineCommand) {
        match command {
            EngineCommand::Submit(request, events) => {
                self.waiters.insert(request.id, events);
                self.core.submit(request);
            }
            EngineCommand::Abort(id) => {
                self.waiters.remove(&id);
                self.core.abort(id);
            }
        }
    }

    fn dispatch(&mut self) {
        for output in self.core.take_outputs() {
            self.on_output(output);
        }
        if let Some(publisher) = &self.publisher {
            publisher.publish(self.core.take_changes());
        }
        let (running, waiting) = (self.core.running(), self.core.waiting());
        self.metrics
            .set_gauges(running, waiting, self.core.cache().usage());
    }

    fn on_output(&mut self, output: Output) {
        match output {
            Output::Admitted {
                prompt_tokens,
                cached_tokens,
                ..
            } => {
                self.metrics.on_admitted(prompt_tokens, cached_tokens);
            }
            Output::FirstToken {
                id,
                at,
                ttft,
                cached_tokens,
            } => {
                self.metrics.on_first_token(ttft);
                let first_at = self.clock.instant(at);
                let interval = self.clock.real(self.core.timing().decode_s_per_token);
                self.notify(
                    id,
                    EngineEvent::FirstToken {
                        cached_tokens,
                        first_at,
                        interval,
                    },
                    false,
                );
            }
            Output::Finished {
                id, output_tokens, ..
            } => {
                self.metrics.on_finished(output_tokens);
                self.notify(id, EngineEvent::Finished, true);
            }
            Output::Rejected { id } => self.notify(id, EngineEvent::Rejected, true),
        }
    }

    fn notify(&mut self, id: u64, event: EngineEvent, last: bool) {
        if last {
            if let Some(sender) = self.waiters.remove(&id) {
                let _ = sender.send(event);
            }
        } else if let Some(sender) = self.waiters.get(&id) {
            let _ = sender.send(event);
        }
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
