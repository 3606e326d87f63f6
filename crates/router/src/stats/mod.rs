//! The router's own metrics, all named `prefix_router_*`: requests, routing decisions,
//! exchanges with backends, request bodies, config reloads and the prefix index. Each other
//! part (fleet, admission, KV events, traces, tokens, replication) defines its metrics
//! beside its code and registers them in the same [`Registry`]; this module imports none of
//! them. Methods take typed values (an endpoint, an outcome, usage), so a label mistake is
//! a compile error.

mod index;
mod labels;
mod models;
mod registry;
mod totals;
mod usage;

use std::time::Duration;

use prefix_router_core::policy::Outcome;
use prefix_router_core::request::Endpoint;
use prefix_router_core::units::TextBytes;
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts};

pub use index::IndexMetrics;
use labels::Reload;
pub use labels::{RetryReason, Split};
pub use models::{ModelExchange, ModelMetrics, OTHER};
pub(crate) use registry::label_set;
pub use registry::{Counters, Label, Registry};
pub use totals::{BackendTotals, Totals};
pub use usage::{Usage, UsageScanner};

/// The router's metrics as a whole.
pub struct Stats {
    registry: Registry,
    policy: &'static str,
    requests: IntCounterVec,
    decisions: IntCounterVec,
    matched_bytes: IntCounter,
    text_bytes: IntCounter,
    retries: Counters<RetryReason>,
    retry_budget_exhausted: IntCounter,
    split: Counters<Split>,
    ttfb: HistogramVec,
    upstream_duration: HistogramVec,
    body_bytes: Histogram,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    /// Requests by backend alone, for `/stats` (not exported: `requests` has them).
    backend_requests: IntCounterVec,
    reloads: Counters<Reload>,
    generation: IntGauge,
    /// The prefix index and the policy's tables.
    pub index: IndexMetrics,
    /// Requests and hit rates by model.
    pub models: ModelMetrics,
}

impl Stats {
    /// The router's metrics for `policy`, registered in `registry`.
    pub fn new(registry: &Registry, policy: &'static str) -> Self {
        let r = registry;
        let per_backend = |short, help| r.counter_vec(short, help, &["backend"]);
        let body_buckets = prometheus::exponential_buckets(1024.0, 4.0, 10).unwrap_or_default();
        let stats = Stats {
            registry: registry.clone(),
            policy,
            requests: r.counter_vec(
                "requests_total",
                "Requests by route, status and backend",
                &["route", "status", "backend"],
            ),
            decisions: r.counter_vec(
                "decisions_total",
                "Routing decisions by policy and outcome",
                &["policy", "outcome"],
            ),
            matched_bytes: r.counter(
                "matched_bytes_total",
                "Routing text the chosen backend was believed to hold",
            ),
            text_bytes: r.counter("text_bytes_total", "Routing text routed"),
            retries: r.counters(
                "retries_total",
                "Attempts retried on another backend, by what failed",
                "reason",
            ),
            retry_budget_exhausted: r.counter(
                "retry_budget_exhausted_total",
                "Failed attempts not retried because the retry budget was spent",
            ),
            split: r.counters(
                "disaggregated_total",
                "Requests of a disaggregated fleet, in two legs or decoded where their prefix was",
                "way",
            ),
            ttfb: r.seconds_by_backend(
                "upstream_first_byte_seconds",
                "Request sent to first response body byte",
            ),
            upstream_duration: r.seconds_by_backend(
                "upstream_duration_seconds",
                "Request sent to end of response",
            ),
            body_bytes: r.histogram("request_body_bytes", "Request body size", body_buckets),
            prompt_tokens: per_backend(
                "backend_prompt_tokens_total",
                "Prompt tokens backends reported",
            ),
            cached_tokens: per_backend(
                "backend_cached_tokens_total",
                "Cached prompt tokens backends reported",
            ),
            backend_requests: IntCounterVec::new(Opts::new("backend_requests", "-"), &["backend"])
                .unwrap_or_else(|_| panic!("invalid static metric definition")),
            reloads: r.counters("config_reloads_total", "Config reloads by result", "result"),
            generation: r.gauge("config_generation", "Configuration generation"),
            index: IndexMetrics::new(registry),
            models: ModelMetrics::new(registry),
        };
        stats.generation.set(1);
        stats
    }

    /// A request ended with `status` (0: no response was sent) on `backend`, if it got one;
    /// `endpoint` is the routed endpoint it asked for, if any.
    pub fn request(&self, endpoint: Option<Endpoint>, status: u16, backend: Option<&str>) {
        let status = match status {
            0 => "none".to_string(),
            code => code.to_string(),
        };
        let backend = backend.unwrap_or("-");
        let route = endpoint.map_or("other", Endpoint::label);
        let labels = [route, status.as_str(), backend];
        self.requests.with_label_values(&labels).inc();
        self.backend_requests.with_label_values(&[backend]).inc();
    }

    /// The policy placed a request of `text` routing text, believing the backend held
    /// `matched` of it.
    pub fn decision(&self, outcome: Outcome, matched: TextBytes, text: TextBytes) {
        let labels = [self.policy, outcome.label()];
        self.decisions.with_label_values(&labels).inc();
        self.matched_bytes.inc_by(matched.0 as u64);
        self.text_bytes.inc_by(text.0 as u64);
    }

    /// What was seen of one response from `backend`: time to its first body byte, its whole
    /// duration, and the usage it reported.
    pub fn exchange(
        &self,
        backend: &str,
        first: Option<Duration>,
        total: Duration,
        usage: Option<Usage>,
    ) {
        let backend = [backend];
        if let Some(first) = first {
            self.ttfb
                .with_label_values(&backend)
                .observe(first.as_secs_f64());
        }
        (self.upstream_duration.with_label_values(&backend)).observe(total.as_secs_f64());
        if let Some(usage) = usage {
            self.prompt_tokens
                .with_label_values(&backend)
                .inc_by(usage.prompt);
            self.cached_tokens
                .with_label_values(&backend)
                .inc_by(usage.cached);
        }
    }

    /// An attempt that failed for `reason` is tried on another backend.
    pub fn retry(&self, reason: RetryReason) {
        self.retries.inc(reason);
    }

    /// A request of a disaggregated fleet went `way`.
    pub fn split(&self, way: Split) {
        self.split.inc(way);
    }

    /// A failed attempt was not retried: the retry budget was spent.
    pub fn retry_budget_exhausted(&self) {
        self.retry_budget_exhausted.inc();
    }

    /// A request body of `bytes` was read.
    pub fn body(&self, bytes: usize) {
        self.body_bytes.observe(bytes as f64);
    }

    /// A config reload was tried; an applied one starts a new generation.
    pub fn reload(&self, applied: bool) {
        self.reloads
            .inc(if applied { Reload::Ok } else { Reload::Failed });
    }

    /// A changed configuration was applied: the generation goes up by one.
    pub fn next_generation(&self) {
        self.generation.inc();
    }

    /// The configuration generation (1 at start).
    pub fn generation(&self) -> i64 {
        self.generation.get()
    }

    /// Every metric of the registry (the router's and its parts') in Prometheus text.
    pub fn render(&self) -> Vec<u8> {
        self.registry.render()
    }
}

#[cfg(test)]
mod tests;
