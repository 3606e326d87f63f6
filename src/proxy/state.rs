//! What every request shares: the fleet, the selector, the stats, the upstream connection
//! pool, and the limits a reload may change (swapped as one snapshot).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use arc_swap::ArcSwap;
use pingora_core::connectors::TransportConnector;

use crate::config::{Config, Timeouts};
use crate::fleet::Fleet;
use crate::policy::Selector;
use crate::request::SessionHeaders;
use crate::stats::Stats;

/// Per-request limits, replaced as a whole on reload.
pub struct Limits {
    /// Upstream and client timeouts.
    pub timeouts: Timeouts,
    /// Other backends tried after a failed connection.
    pub retries: usize,
    /// Failed exchanges in a row that take a backend out (0: never).
    pub passive_failures: usize,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Session id headers.
    pub session_headers: SessionHeaders,
}

impl Limits {
    fn of(config: &Config) -> Self {
        Limits {
            timeouts: config.timeouts.clone(),
            retries: config.retries,
            passive_failures: config.passive_failures,
            max_body_bytes: config.max_body_bytes,
            session_headers: SessionHeaders::new(config.session_headers.clone()),
        }
    }
}

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
    /// State for `config` over `fleet`.
    pub fn new(config: &Config, fleet: Arc<Fleet>, selector: Selector, stats: Arc<Stats>) -> Self {
        State {
            fleet,
            selector,
            stats,
            policy_name: config.policy.name,
            connector: TransportConnector::new(None),
            limits: ArcSwap::from_pointee(Limits::of(config)),
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

    /// Applies what of `config` can change while serving (workers aside).
    pub fn apply(&self, config: &Config) {
        self.limits.store(Arc::new(Limits::of(config)));
        self.selector.tunables().set(config.tunables());
        self.fleet.set_timeouts(config.timeouts.clone());
    }
}
