//! The upkeep service: runs the ledger's upkeep of the policy's index and tables (index
//! budgets sized from the capacities backends published, a full sweep every
//! `eviction_interval` or when the fleet changed, eviction alone when a decision found
//! the index grown) every second, and at once when the selector signals growth.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::sync::Notify;

use crate::state::State;

/// The upkeep service, before it has state to keep.
#[derive(Default)]
pub struct Upkeep {
    wake: Arc<Notify>,
}

impl Upkeep {
    /// What wakes upkeep early (the selector's signal that the index grew).
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
        let started = Instant::now();
        let state = &self.state;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.upkeep.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
            let snapshot = state.fleet.snapshot();
            let accounts = snapshot.accounts();
            let now = started.elapsed();
            let evicted = state
                .upkeep
                .run(now, snapshot.generation, &state.selector, &accounts);
            state.stats.index.evicted(evicted);
        }
    }
}
