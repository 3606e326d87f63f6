//! Upkeep of the prefix index and the session table: eviction and session expiry every
//! `eviction_interval`, eviction alone as soon as the selector says the tree grew by a tenth
//! of its budget, a sweep within a second of a fleet change (to drop removed backends'
//! entries), and each backend's index budget sized from the KV capacity it published
//! (within a second of learning it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::sync::Notify;

use crate::state::State;

/// The upkeep service, before it has state to keep.
pub struct Upkeep {
    interval: Duration,
    wake: Arc<Notify>,
}

impl Upkeep {
    /// Upkeep every `interval`.
    pub fn new(interval: Duration) -> Self {
        Upkeep {
            interval,
            wake: Arc::new(Notify::new()),
        }
    }

    /// What wakes upkeep early (the selector's signal that the tree grew).
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// The service over `state`.
    pub fn run(self, state: Arc<State>) -> Running {
        Running {
            upkeep: self,
            state,
        }
    }
}

/// The upkeep service over its state.
pub struct Running {
    upkeep: Upkeep,
    state: Arc<State>,
}

#[async_trait]
impl BackgroundService for Running {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last = Instant::now();
        let mut generation = 0;
        let selector = &self.state.selector;
        loop {
            let grown = tokio::select! {
                _ = tick.tick() => false,
                _ = self.upkeep.wake.notified() => true,
                _ = shutdown.changed() => return,
            };
            let snapshot = self.state.fleet.snapshot();
            for backend in &snapshot.backends {
                if let Some(bytes) = backend.budget_change() {
                    selector.set_budget(backend.id, bytes);
                }
            }
            let evicted =
                if last.elapsed() >= self.upkeep.interval || snapshot.generation != generation {
                    (last, generation) = (Instant::now(), snapshot.generation);
                    selector.maintain(&|id| snapshot.backends.iter().any(|b| b.id == id))
                } else if grown {
                    selector.trim_tree()
                } else {
                    0
                };
            self.state.stats.evicted(evicted);
        }
    }
}
