//! What every request and every part of the serving layer shares: the fleet, the selector,
//! the stats, the upstream connection pool, the limits a reload may change (swapped as one
//! snapshot), and the count of requests being served.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use arc_swap::ArcSwap;
use pingora_core::connectors::TransportConnector;
use prefix_router_core::policy::{Selector, Ties};

use crate::fleet::Fleet;
use crate::proxy::{Budget, Limits, Queue};
use crate::stats::Stats;

/// Everything requests share.
pub struct State {
    /// Backends.
    pub fleet: Arc<Fleet>,
    /// Policy with session affinity.
    pub selector: Selector,
    /// Metrics.
    pub stats: Arc<Stats>,
    /// The policy's name, for metrics.
    pub policy_name: &'static str,
    /// Pooled upstream connections.
    pub connector: TransportConnector,
    /// Turns among equally loaded backends for requests placed without the policy.
    pub ties: Ties,
    /// Bytes of request bodies held, bounded.
    pub budget: Arc<Budget>,
    /// Requests waiting for a backend below its in-flight limit.
    pub queue: Queue,
    limits: ArcSwap<Limits>,
    active: AtomicUsize,
    draining: AtomicBool,
}

/// One request being served (from its header to its log line); dropping it ends it.
pub struct Active(Arc<State>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

impl State {
    /// State over `fleet`, placing with `selector` (whose policy is `policy_name`) and
    /// serving within `limits` and `budget`.
    pub fn new(
        fleet: Arc<Fleet>,
        selector: Selector,
        policy_name: &'static str,
        limits: Limits,
        budget: Arc<Budget>,
        stats: Arc<Stats>,
    ) -> Self {
        State {
            fleet,
            selector,
            stats,
            policy_name,
            connector: TransportConnector::new(None),
            ties: Ties::new(0),
            budget,
            queue: Queue::default(),
            limits: ArcSwap::from_pointee(limits),
            active: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        }
    }

    /// Counts a request as being served until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Relaxed);
        Active(Arc::clone(self))
    }

    /// From now on, responses close their connections: the process is about to stop or to
    /// hand its listeners to a new one, and clients should not reuse connections to it.
    pub fn start_draining(&self) {
        self.draining.store(true, Relaxed);
    }

    /// Whether responses close their connections.
    pub fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    /// Requests being served, in any phase.
    pub fn active(&self) -> usize {
        self.active.load(Relaxed)
    }

    /// The current limits.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits.load_full()
    }

    /// Requests read from now on get `limits`.
    pub fn set_limits(&self, limits: Limits) {
        self.limits.store(Arc::new(limits));
    }
}
