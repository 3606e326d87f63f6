//! What a reload may change while requests are served, as one snapshot ([`LiveLimits`]):
//! the limits each request is held to, the policy's tunables and the tenants. The state
//! swaps it whole; each request reads it once. Each type here owns its defaults.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prefix_router_core::policy::{SharedTunables, Tunables};
use prefix_router_core::request::SessionSources;

use crate::fleet::OutlierSettings;
use crate::tenants::Tenants;

/// The current [`LiveLimits`] snapshot, shared by whoever reads it.
#[derive(Clone, Default)]
pub struct Current(Arc<ArcSwap<LiveLimits>>);

impl Current {
    /// Starting from `live`.
    pub fn new(live: LiveLimits) -> Self {
        Current(Arc::new(ArcSwap::from_pointee(live)))
    }

    /// The snapshot now.
    pub fn get(&self) -> Arc<LiveLimits> {
        self.0.load_full()
    }

    /// Replaces the snapshot: requests read from now on get `live`.
    pub fn swap(&self, live: LiveLimits) {
        self.0.store(Arc::new(live));
    }

    /// The policy's tunables, read from the snapshot at each decision.
    pub fn tunables(&self) -> SharedTunables {
        let current = self.clone();
        SharedTunables::reading(move || current.0.load().tunables)
    }

    /// The body budget's limit, read from the snapshot whenever a body asks for bytes.
    pub fn buffered_bytes(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let current = self.clone();
        move || current.0.load().limits.max_buffered_bytes
    }
}

/// The snapshot a reload swaps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveLimits {
    /// What each request may take and do.
    pub limits: Limits,
    /// The policy's reloadable parameters (match threshold, imbalance bounds).
    pub tunables: Tunables,
    /// The tenants of `tenants_file` (none: every request is one tenant).
    pub tenants: Arc<Tenants>,
}

/// What each request may take and do.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest request body, bytes. Default 32 MiB.
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at most, summed over requests. Default 1 GiB.
    pub max_buffered_bytes: usize,
    /// Silence allowed from a client sending its body. Default 60 s.
    pub client_read: Duration,
    /// Whole time a client may take to send its body (32 MiB at about 110 KB/s). Default 300 s.
    pub client_body: Duration,
    /// When a request is tried on another backend, how often, under which budget.
    pub retry: RetrySettings,
    /// When backends are ejected for their answers or failures.
    pub outlier: OutlierSettings,
    /// Where session ids are read, in order of preference: headers, then body fields.
    /// Default: the headers of [`DEFAULT_HEADERS`](prefix_router_core::request::DEFAULT_HEADERS),
    /// then every [`SessionField`](prefix_router_core::request::SessionField).
    pub sessions: SessionSources,
    /// Timeouts of each exchange with a backend.
    pub exchange: ExchangeTimeouts,
    /// Longest wait of a body for buffer budget before 503. Default 10 s.
    pub admission_timeout: Duration,
    /// Requests in flight per backend at most; 0: no limit. Default 0.
    pub max_inflight_per_backend: usize,
    /// Requests waiting in the router's queue at most. Default 1024.
    pub max_queued: usize,
    /// Requests of one tenant waiting in the router's queue at most; 0: only
    /// `max_queued`. Default 0.
    pub max_queued_per_tenant: usize,
    /// Requests of one priority waiting in the router's queue at most; 0: only
    /// `max_queued`. Default 0.
    pub max_queued_per_priority: usize,
    /// Longest wait in the router's queue before 503. Default 30 s.
    pub queue_timeout: Duration,
    /// Prompt tokens at most that a decode instance computes itself, skipping a
    /// disaggregated request's prefill leg. Default 1000.
    pub max_local_prefill_length: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_buffered_bytes: 1 << 30,
            client_read: Duration::from_secs(60),
            client_body: Duration::from_secs(300),
            retry: RetrySettings::default(),
            outlier: OutlierSettings::default(),
            sessions: SessionSources::default(),
            exchange: ExchangeTimeouts::default(),
            admission_timeout: Duration::from_secs(10),
            max_inflight_per_backend: 0,
            max_queued: 1024,
            max_queued_per_tenant: 0,
            max_queued_per_priority: 0,
            queue_timeout: Duration::from_secs(30),
            max_local_prefill_length: 1000,
        }
    }
}

/// Timeouts of one exchange with a backend.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeTimeouts {
    /// Time to connect to a backend. Default 5 s.
    pub connect: Duration,
    /// Wait for a backend's first response body byte (a non-streamed generation sends
    /// nothing until it is done). Default 600 s.
    pub first_byte: Duration,
    /// Silence allowed from a backend between response chunks. Default 120 s.
    pub idle: Duration,
    /// Time one write to a backend may take. Default 60 s.
    pub write: Duration,
    /// Time an idle pooled connection is kept. Default 60 s.
    pub pool_idle: Duration,
}

impl Default for ExchangeTimeouts {
    fn default() -> Self {
        ExchangeTimeouts {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(600),
            idle: Duration::from_secs(120),
            write: Duration::from_secs(60),
            pool_idle: Duration::from_secs(60),
        }
    }
}

/// Retries before the first byte: a request that got no answer, or a 5xx answer of which
/// nothing reached the client yet, is tried on another ready backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrySettings {
    /// Other backends tried at most per request. Default 2.
    pub max: usize,
    /// What is retried. Default every condition.
    pub on: RetryOn,
    /// Retries in progress at most, as a percentage of the requests being served (Envoy's
    /// retry budget), so that retries cannot multiply the load of an outage. Default 20.
    pub budget_percent: usize,
    /// Retries in progress always allowed, whatever the budget. Default 3.
    pub min_concurrency: usize,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max: 2,
            on: RetryOn::default(),
            budget_percent: 20,
            min_concurrency: 3,
        }
    }
}

/// The conditions that are retried (`retry_on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryOn {
    /// `connect-failure`: the request never reached the backend (no connection, or a
    /// pooled connection the backend had closed).
    pub connect_failure: bool,
    /// `reset`: the request was sent, and the connection closed or timed out before any
    /// answer (routed inference endpoints, GET and HEAD only).
    pub reset: bool,
    /// `5xx`: a 500, 502, 504, or 503 without `retry-after`, before any byte of it reached
    /// the client (routed inference endpoints, GET and HEAD only).
    pub status: bool,
}

impl Default for RetryOn {
    fn default() -> Self {
        RetryOn {
            connect_failure: true,
            reset: true,
            status: true,
        }
    }
}

impl RetryOn {
    /// The names `retry_on` takes.
    pub const NAMES: [&'static str; 3] = ["connect-failure", "reset", "5xx"];

    /// The conditions `names` list; the unknown name, if one is.
    pub fn parse<'n>(names: impl IntoIterator<Item = &'n str>) -> Result<RetryOn, &'n str> {
        let mut on = RetryOn {
            connect_failure: false,
            reset: false,
            status: false,
        };
        for name in names {
            match name.trim() {
                "connect-failure" => on.connect_failure = true,
                "reset" => on.reset = true,
                "5xx" => on.status = true,
                _ => return Err(name),
            }
        }
        Ok(on)
    }
}
