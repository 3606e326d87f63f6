//! What every request and every part of the serving layer shares: the fleet, the selector,
//! the ledger, the stats, the upstream connection pool, the settings a reload may change
//! (one snapshot), what holds requests back (body budget, queue), and the count of
//! requests being served.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use pingora_core::connectors::TransportConnector;
use prefix_router_core::ledger::{Account, UpkeepSchedule};
use prefix_router_core::policy::{Selector, Ties};

use crate::admission::{AdmissionMetrics, Budget, Queue, RetryBudget};
use crate::fleet::{AfterRead, Fleet};
use crate::kv_events::Records;
use crate::limits::{Current, LiveLimits};
use crate::responses::ResponseHomes;
use crate::stats::Stats;
use crate::tenants::Tenancy;
use crate::tokens::Tokenizers;
use crate::traces::Tracing;

/// Everything requests share.
pub struct State {
    /// Backends.
    pub fleet: Arc<Fleet>,
    /// The policy and what it keeps.
    pub selector: Selector,
    /// Placement bookkeeping and the upkeep schedule.
    pub upkeep: UpkeepSchedule,
    /// The router's metrics.
    pub stats: Arc<Stats>,
    /// The policy's name.
    pub policy_name: &'static str,
    /// Pooled upstream connections.
    pub connector: TransportConnector,
    /// Turns among equally loaded backends for requests placed without the policy.
    pub ties: Ties,
    /// Bytes of request bodies held, bounded.
    pub budget: Arc<Budget>,
    /// Requests waiting for a backend below its in-flight limit.
    pub queue: Queue,
    /// What the budget and the queue count.
    pub admission: AdmissionMetrics,
    /// Retries in progress, bounded.
    pub retry_budget: RetryBudget,
    /// The tenants' rate limits and metrics.
    pub tenancy: Tenancy,
    /// The models' tokenizers (token mode) and their token cache.
    pub tokenizers: Tokenizers,
    /// What backends that publish KV events hold, by their own record.
    pub records: Arc<Records>,
    /// Trace export (off unless configured).
    pub tracing: Tracing,
    /// Which backend made each stored response.
    pub responses: Arc<ResponseHomes>,
    live: Current,
    active: AtomicUsize,
    draining: AtomicBool,
}

/// What a [`State`] is made of.
pub struct Parts {
    /// Backends.
    pub fleet: Arc<Fleet>,
    /// The policy and what it keeps.
    pub selector: Selector,
    /// The policy's name.
    pub policy_name: &'static str,
    /// Placement bookkeeping.
    pub upkeep: UpkeepSchedule,
    /// The settings a reload swaps (the selector and the budget read them too).
    pub live: Current,
    /// The router's metrics.
    pub stats: Arc<Stats>,
    /// Admission's metrics.
    pub admission: AdmissionMetrics,
    /// The models' tokenizers.
    pub tokenizers: Tokenizers,
    /// The KV event records (empty until subscribers fill them).
    pub records: Arc<Records>,
    /// The tenants' rate limits and metrics.
    pub tenancy: Tenancy,
    /// Trace export.
    pub tracing: Tracing,
    /// How long a response id is remembered after its last use (`session_ttl`).
    pub response_ttl: std::time::Duration,
}

/// One request being served (from its header to its log line); dropping it ends it.
pub struct Active(Arc<State>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

impl State {
    /// State of `parts`; the body budget reads its limit from `parts.live`.
    pub fn new(parts: Parts) -> Self {
        let connector = TransportConnector::new(parts.fleet.tls().connector());
        let active_after = parts.live.get().tenants.active_after();
        parts.tenancy.set_active_after(active_after);
        State {
            fleet: parts.fleet,
            selector: parts.selector,
            upkeep: parts.upkeep,
            stats: parts.stats,
            policy_name: parts.policy_name,
            connector,
            ties: Ties::new(0),
            budget: Budget::reading(parts.live.buffered_bytes()),
            queue: Queue::default(),
            admission: parts.admission,
            retry_budget: RetryBudget::default(),
            tenancy: parts.tenancy,
            tokenizers: parts.tokenizers,
            records: parts.records,
            tracing: parts.tracing,
            responses: Arc::new(ResponseHomes::new(parts.response_ttl)),
            live: parts.live,
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

    /// The settings now.
    pub fn live(&self) -> Arc<LiveLimits> {
        self.live.get()
    }

    /// Requests read from now on get `live`; bodies waiting for budget look again.
    pub fn swap_live(&self, live: LiveLimits) {
        self.tenancy.set_active_after(live.tenants.active_after());
        self.live.swap(live);
        self.budget.wake();
    }
}

impl AfterRead for State {
    fn on(&self) -> bool {
        self.live().tenants.configured()
    }

    /// Flow control's steps after a read ([`Tenancy::after_read`]); what the engines
    /// queue past their holds is taken back as far as the queue has room.
    fn read(&self, accounts: &[&Account]) {
        let live = self.live();
        let room = (live.limits.max_queued).saturating_sub(self.queue.len());
        let standing = live.tenants.standing_slots();
        self.tenancy.after_read(accounts, room, standing);
    }
}
