//! Built-in stats: Prometheus counters and histograms, all named `prefix_router_*`. Every part
//! of the router writes here; this module imports none of them (labels are plain strings).
//! Gauges that describe current state (in-flight, health, tree size) are set from snapshots
//! just before each scrape, by the admin service.

mod usage;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use usage::{Usage, UsageScanner};

/// The router's metrics.
pub struct Stats {
    registry: Registry,
    /// Requests by route, status and backend.
    pub requests: IntCounterVec,
    /// Routing decisions by policy and outcome.
    pub decisions: IntCounterVec,
    /// Bytes of routing text the chosen backend was believed to hold.
    pub matched_bytes: IntCounter,
    /// Bytes of routing text routed.
    pub text_bytes: IntCounter,
    /// Attempts retried on another backend.
    pub retries: IntCounter,
    /// Time from sending the request to the first response body byte, by backend.
    pub ttfb: HistogramVec,
    /// Time from sending the request to the end of the response, by backend.
    pub upstream_duration: HistogramVec,
    /// Request body sizes.
    pub body_bytes: Histogram,
    /// Prompt tokens backends reported (`usage.prompt_tokens`), by backend.
    pub prompt_tokens: IntCounterVec,
    /// Of those, cached (`usage.prompt_tokens_details.cached_tokens`), by backend.
    pub cached_tokens: IntCounterVec,
    /// Config reloads by result (ok, failed).
    pub reloads: IntCounterVec,
    /// Configuration generation: 1 at start, +1 per applied reload.
    pub generation: IntGauge,
    /// Prefix-tree text evicted.
    pub evicted_bytes: IntCounter,
    /// Requests in flight, by backend.
    pub inflight: IntGaugeVec,
    /// 1 when the backend is ready for requests, by backend.
    pub healthy: IntGaugeVec,
    /// Prefix-tree text and nodes, by model.
    pub tree_bytes: IntGaugeVec,
    /// Prefix-tree nodes, by model.
    pub tree_nodes: IntGaugeVec,
    /// Sessions remembered.
    pub sessions: IntGauge,
}

fn name(short: &str, help: &str) -> Opts {
    Opts::new(format!("prefix_router_{short}"), help)
}

fn seconds(short: &str, help: &str) -> HistogramOpts {
    let buckets = vec![
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    HistogramOpts::new(format!("prefix_router_{short}"), help).buckets(buckets)
}

impl Stats {
    /// Fresh metrics in a registry of their own.
    pub fn new() -> Self {
        let body_buckets = prometheus::exponential_buckets(1024.0, 4.0, 10).unwrap_or_default();
        let stats = Stats {
            registry: Registry::new(),
            requests: counter_vec(
                "requests_total",
                "Requests by route, status and backend",
                &["route", "status", "backend"],
            ),
            decisions: counter_vec(
                "decisions_total",
                "Routing decisions by policy and outcome",
                &["policy", "outcome"],
            ),
            matched_bytes: counter(
                "matched_bytes_total",
                "Routing text the chosen backend was believed to hold",
            ),
            text_bytes: counter("text_bytes_total", "Routing text routed"),
            retries: counter("retries_total", "Attempts retried on another backend"),
            ttfb: histogram_vec(
                "upstream_first_byte_seconds",
                "Request sent to first response body byte",
            ),
            upstream_duration: histogram_vec(
                "upstream_duration_seconds",
                "Request sent to end of response",
            ),
            body_bytes: Histogram::with_opts(
                HistogramOpts::new("prefix_router_request_body_bytes", "Request body size")
                    .buckets(body_buckets),
            )
            .unwrap_or_else(|_| unreachable_metric()),
            prompt_tokens: counter_vec(
                "backend_prompt_tokens_total",
                "Prompt tokens backends reported",
                &["backend"],
            ),
            cached_tokens: counter_vec(
                "backend_cached_tokens_total",
                "Cached prompt tokens backends reported",
                &["backend"],
            ),
            reloads: counter_vec(
                "config_reloads_total",
                "Config reloads by result",
                &["result"],
            ),
            generation: gauge("config_generation", "Configuration generation"),
            evicted_bytes: counter("tree_evicted_bytes_total", "Prefix-tree text evicted"),
            inflight: gauge_vec("inflight_requests", "Requests in flight", &["backend"]),
            healthy: gauge_vec(
                "backend_healthy",
                "1 when the backend is ready",
                &["backend"],
            ),
            tree_bytes: gauge_vec("tree_bytes", "Prefix-tree text bytes", &["model"]),
            tree_nodes: gauge_vec("tree_nodes", "Prefix-tree nodes", &["model"]),
            sessions: gauge("sessions", "Sessions remembered"),
        };
        stats.register_all();
        stats.generation.set(1);
        stats
    }

    fn collectors(&self) -> [Box<dyn prometheus::core::Collector>; 18] {
        [
            Box::new(self.requests.clone()),
            Box::new(self.decisions.clone()),
            Box::new(self.matched_bytes.clone()),
            Box::new(self.text_bytes.clone()),
            Box::new(self.retries.clone()),
            Box::new(self.ttfb.clone()),
            Box::new(self.upstream_duration.clone()),
            Box::new(self.body_bytes.clone()),
            Box::new(self.prompt_tokens.clone()),
            Box::new(self.cached_tokens.clone()),
            Box::new(self.reloads.clone()),
            Box::new(self.generation.clone()),
            Box::new(self.evicted_bytes.clone()),
            Box::new(self.inflight.clone()),
            Box::new(self.healthy.clone()),
            Box::new(self.tree_bytes.clone()),
            Box::new(self.tree_nodes.clone()),
            Box::new(self.sessions.clone()),
        ]
    }

    fn register_all(&self) {
        for collector in self.collectors() {
            // Names are fixed and distinct, so registering cannot collide.
            if let Err(e) = self.registry.register(collector) {
                log::error!("metric registration failed: {e}");
            }
        }
    }

    /// The names of every metric.
    pub fn names(&self) -> Vec<String> {
        let collectors = self.collectors();
        let descs = collectors.iter().flat_map(|c| {
            c.desc()
                .into_iter()
                .map(|d| d.fq_name.clone())
                .collect::<Vec<_>>()
        });
        descs.collect()
    }

    /// Records what a backend reported it had cached for one response.
    pub fn usage(&self, backend: &str, usage: Usage) {
        self.prompt_tokens
            .with_label_values(&[backend])
            .inc_by(usage.prompt);
        self.cached_tokens
            .with_label_values(&[backend])
            .inc_by(usage.cached);
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 << 10);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::error!("metrics encoding failed: {e}");
        }
        out
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

/// Metric options here are static and valid; constructors fail only on invalid names.
fn unreachable_metric<T>() -> T {
    panic!("invalid static metric definition")
}

fn counter(short: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(name(short, help)).unwrap_or_else(|_| unreachable_metric())
}

fn counter_vec(short: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(name(short, help), labels).unwrap_or_else(|_| unreachable_metric())
}

fn gauge(short: &str, help: &str) -> IntGauge {
    IntGauge::with_opts(name(short, help)).unwrap_or_else(|_| unreachable_metric())
}

fn gauge_vec(short: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(name(short, help), labels).unwrap_or_else(|_| unreachable_metric())
}

fn histogram_vec(short: &str, help: &str) -> HistogramVec {
    HistogramVec::new(seconds(short, help), &["backend"]).unwrap_or_else(|_| unreachable_metric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grafana_dashboard_uses_only_exported_metrics() {
        let names = Stats::new().names();
        let dashboard = include_str!("../../conf/grafana-dashboard.json");
        let used: Vec<&str> = dashboard
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("prefix_router_"))
            .collect();
        assert!(used.len() > 10);
        for name in used {
            let base = name.strip_suffix("_bucket").unwrap_or(name);
            assert!(names.iter().any(|n| n == base), "{name} is not exported");
        }
    }

    #[test]
    fn renders_prometheus_text() {
        let stats = Stats::new();
        stats
            .requests
            .with_label_values(&["chat", "200", "http://b:1"])
            .inc();
        stats.usage(
            "http://b:1",
            Usage {
                prompt: 10,
                cached: 4,
            },
        );
        let text = String::from_utf8(stats.render()).unwrap();
        assert!(text.contains(
            "prefix_router_requests_total{backend=\"http://b:1\",route=\"chat\",status=\"200\"} 1"
        ));
        assert!(
            text.contains("prefix_router_backend_cached_tokens_total{backend=\"http://b:1\"} 4")
        );
    }
}
