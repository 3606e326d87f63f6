//! What a reload may change while requests are served, as one snapshot ([`Live`]): the
//! limits each request is held to and the policy's tunables. The state swaps it whole;
//! each request reads it once. Each type here owns its defaults.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prefix_router_core::policy::{SharedTunables, Tunables};
use prefix_router_core::request::SessionHeaders;

/// The current [`Live`] snapshot, shared by whoever reads it.
#[derive(Clone, Default)]
pub struct Current(Arc<ArcSwap<Live>>);

impl Current {
    /// Starting from `live`.
    pub fn new(live: Live) -> Self {
        Current(Arc::new(ArcSwap::from_pointee(live)))
    }

    /// The snapshot now.
    pub fn get(&self) -> Arc<Live> {
        self.0.load_full()
    }

    /// Replaces the snapshot: requests read from now on get `live`.
    pub fn swap(&self, live: Live) {
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
pub struct Live {
    /// What each request may take and do.
    pub limits: Limits,
    /// The policy's reloadable parameters (match threshold, imbalance bounds).
    pub tunables: Tunables,
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
    /// Other backends tried after a failed connection. Default 2.
    pub retries: usize,
    /// Failed exchanges in a row that take a backend out until its next passed health
    /// check; 0 disables. Default 3.
    pub passive_failures: usize,
    /// Session id headers, in order of preference. Default `x-session-id`.
    pub session_headers: SessionHeaders,
    /// Timeouts of each exchange with a backend.
    pub exchange: ExchangeTimeouts,
    /// Longest wait of a body for buffer budget before 503. Default 10 s.
    pub admission_timeout: Duration,
    /// Requests in flight per backend at most; 0: no limit. Default 0.
    pub max_inflight_per_backend: usize,
    /// Requests waiting in the router's queue at most. Default 1024.
    pub max_queued: usize,
    /// Longest wait in the router's queue before 503. Default 30 s.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_buffered_bytes: 1 << 30,
            client_read: Duration::from_secs(60),
            client_body: Duration::from_secs(300),
            retries: 2,
            passive_failures: 3,
            session_headers: SessionHeaders::default(),
            exchange: ExchangeTimeouts::default(),
            admission_timeout: Duration::from_secs(10),
            max_inflight_per_backend: 0,
            max_queued: 1024,
            queue_timeout: Duration::from_secs(30),
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
