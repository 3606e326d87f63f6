//! Built-in stats: Prometheus counters and histograms, all named `prefix_router_*`. Parts
//! of the router record through typed methods (a request, a decision, an exchange, usage),
//! so a label mistake is a compile error; this module imports none of them. Gauges that
//! describe current state (in-flight, health, tree size) are set from snapshots just before
//! each scrape, by the admin service.

mod usage;

use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use prefix_router_core::policy::TableSize;
use prefix_router_core::units::{KeyBytes, TextBytes};

pub use usage::{Usage, UsageScanner};

/// The router's metrics.
pub struct Stats {
    registry: Registry,
    requests: IntCounterVec,
    decisions: IntCounterVec,
    matched_bytes: IntCounter,
    text_bytes: IntCounter,
    retries: IntCounter,
    ttfb: HistogramVec,
    upstream_duration: HistogramVec,
    body_bytes: Histogram,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    reloads: IntCounterVec,
    generation: IntGauge,
    evicted_bytes: IntCounter,
    inflight: IntGaugeVec,
    healthy: IntGaugeVec,
    live: IntGaugeVec,
    live_tokens: IntGaugeVec,
    kv_capacity: IntGaugeVec,
    tree_bytes: IntGaugeVec,
    tree_nodes: IntGaugeVec,
    tree_heap_bytes: IntGaugeVec,
    table_entries: IntGaugeVec,
    shared_notes: IntCounterVec,
    shared_connected: IntGauge,
    /// Requests by backend alone, for `/stats` (not exported: `requests` has them by route
    /// and status too).
    backend_requests: IntCounterVec,
    buffered_bytes: IntGauge,
    budget_waiting: IntGauge,
    queued: IntGauge,
    queue_wait: Histogram,
    shed: IntCounterVec,
    prompts: IntCounterVec,
    router_tokens: IntCounterVec,
    token_cache_bytes: IntGauge,
    token_cache_entries: IntGauge,
    kv_events: IntCounterVec,
    kv_event_faults: IntCounterVec,
    kv_event_blocks: IntGaugeVec,
    kv_event_record: IntGaugeVec,
    trace_spans: IntCounterVec,
}

/// What one backend's KV event subscriber saw, for the metrics.
pub struct KvEventGauge<'a> {
    /// The backend (the label).
    pub url: &'a str,
    /// Events applied: stored, removed, cleared, unknown.
    pub events: [u64; 4],
    /// Payloads not decoded, gaps, gaps filled by replay.
    pub faults: [u64; 3],
    /// Blocks held on GPU, and elsewhere.
    pub blocks: (usize, usize),
    /// `exact`, `degraded` or `connecting`.
    pub mode: &'static str,
}

/// What `/stats` shows of one backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendTotals {
    /// Requests answered or failed on it.
    pub requests: u64,
    /// Prompt tokens it reported.
    pub prompt_tokens: u64,
    /// Of those, cached.
    pub cached_tokens: u64,
}

/// Router-wide totals for `/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Routing text bytes the chosen backends were believed to hold.
    pub matched_bytes: u64,
    /// Routing text bytes routed.
    pub text_bytes: u64,
    /// Attempts retried on another backend.
    pub retries: u64,
    /// Configuration generation.
    pub generation: i64,
}

/// One backend's state gauges.
pub struct BackendGauge<'a> {
    /// Its URL (the label).
    pub url: &'a str,
    /// Requests in flight.
    pub inflight: usize,
    /// Whether it takes requests.
    pub ready: bool,
    /// Its live conversations and their tokens (estimated in text mode), when the policy
    /// keeps a conversation table.
    pub live: Option<(usize, usize)>,
    /// The KV capacity it published, tokens.
    pub capacity: Option<usize>,
}

/// One model's prefix-tree gauges.
pub struct TreeGauge<'a> {
    /// The model (the label).
    pub model: &'a str,
    /// Key bytes held (8 per block of 16 tokens).
    pub bytes: usize,
    /// Nodes.
    pub nodes: usize,
    /// Bytes the index holds on the heap, nodes and keys.
    pub heap: usize,
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
            evicted_bytes: counter("tree_evicted_bytes_total", "Prefix-index key bytes evicted"),
            inflight: gauge_vec("inflight_requests", "Requests in flight", &["backend"]),
            healthy: gauge_vec(
                "backend_healthy",
                "1 when the backend is ready",
                &["backend"],
            ),
            live: gauge_vec(
                "backend_live_conversations",
                "Conversations expected back on the backend (kv_aware's conversation table)",
                &["backend"],
            ),
            live_tokens: gauge_vec(
                "backend_live_tokens",
                "Prompt tokens of the backend's live conversations: the working set its KV must hold (text bytes / 4 in text mode)",
                &["backend"],
            ),
            kv_capacity: gauge_vec(
                "backend_kv_capacity_tokens",
                "KV cache capacity the backend published, tokens",
                &["backend"],
            ),
            tree_bytes: gauge_vec(
                "tree_bytes",
                "Prefix-index key bytes (8 per 16-token block)",
                &["model"],
            ),
            tree_nodes: gauge_vec("tree_nodes", "Prefix-index nodes", &["model"]),
            tree_heap_bytes: gauge_vec(
                "tree_heap_bytes",
                "Prefix-index heap bytes, nodes and keys",
                &["model"],
            ),
            shared_notes: counter_vec(
                "shared_table_notes_total",
                "Conversation placements exchanged with other router replicas",
                &["direction"],
            ),
            shared_connected: gauge(
                "shared_table_connected",
                "1 while subscribed to the shared table's server",
            ),
            table_entries: gauge_vec(
                "table_entries",
                "Entries of the tables the policy keeps (sessions, conversations)",
                &["table"],
            ),
            backend_requests: counter_vec("backend_requests", "Requests by backend", &["backend"]),
            buffered_bytes: gauge("buffered_bytes", "Request body bytes held"),
            budget_waiting: gauge(
                "budget_waiting_requests",
                "Requests waiting for body budget",
            ),
            queued: gauge("queued_requests", "Requests waiting in the router's queue"),
            queue_wait: Histogram::with_opts(seconds(
                "queue_wait_seconds",
                "Time requests waited in the router's queue",
            ))
            .unwrap_or_else(|_| unreachable_metric()),
            shed: counter_vec(
                "shed_total",
                "Requests refused with 503 overloaded, by reason",
                &["reason"],
            ),
            prompts: counter_vec(
                "prompts_total",
                "Routed prompts of models with a tokenizer, by index mode (tokens, or text \
                 when the body was not rendered) and reason",
                &["mode", "reason"],
            ),
            router_tokens: counter_vec(
                "prompt_tokens_total",
                "Tokens of the prompts the router tokenized, by whether they came from its \
                 token cache or were tokenized now",
                &["source"],
            ),
            token_cache_bytes: gauge(
                "token_cache_bytes",
                "Bytes the conversations' token cache holds",
            ),
            token_cache_entries: gauge(
                "token_cache_entries",
                "Prompt segments the token cache holds",
            ),
            kv_events: counter_vec(
                "kv_events_total",
                "KV events applied, by backend and type",
                &["backend", "type"],
            ),
            kv_event_faults: counter_vec(
                "kv_event_faults_total",
                "KV event batches not decoded, gaps in their sequence numbers, and gaps \
                 filled from the replay socket, by backend",
                &["backend", "kind"],
            ),
            kv_event_blocks: gauge_vec(
                "kv_event_blocks",
                "Blocks each backend holds by its KV events, by medium",
                &["backend", "medium"],
            ),
            kv_event_record: gauge_vec(
                "kv_event_record",
                "1 for each backend's KV event record mode (exact, degraded, connecting)",
                &["backend", "mode"],
            ),
            trace_spans: counter_vec(
                "trace_spans_total",
                "Finished sampled spans: exported, dropped from a full queue, or failed to \
                 export (collector error or timeout)",
                &["outcome"],
            ),
        };
        stats.register_all();
        stats.generation.set(1);
        // Every label value exists from the start, so dashboards have series to show.
        for result in ["ok", "failed"] {
            stats.reloads.with_label_values(&[result]);
        }
        for reason in ["budget", "queue_full", "queue_timeout"] {
            stats.shed.with_label_values(&[reason]);
        }
        stats
    }

    fn collectors(&self) -> [Box<dyn prometheus::core::Collector>; 38] {
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
            Box::new(self.live.clone()),
            Box::new(self.live_tokens.clone()),
            Box::new(self.kv_capacity.clone()),
            Box::new(self.tree_bytes.clone()),
            Box::new(self.tree_nodes.clone()),
            Box::new(self.tree_heap_bytes.clone()),
            Box::new(self.table_entries.clone()),
            Box::new(self.shared_notes.clone()),
            Box::new(self.shared_connected.clone()),
            Box::new(self.buffered_bytes.clone()),
            Box::new(self.budget_waiting.clone()),
            Box::new(self.queued.clone()),
            Box::new(self.queue_wait.clone()),
            Box::new(self.shed.clone()),
            Box::new(self.prompts.clone()),
            Box::new(self.router_tokens.clone()),
            Box::new(self.token_cache_bytes.clone()),
            Box::new(self.token_cache_entries.clone()),
            Box::new(self.kv_events.clone()),
            Box::new(self.kv_event_faults.clone()),
            Box::new(self.kv_event_blocks.clone()),
            Box::new(self.kv_event_record.clone()),
            Box::new(self.trace_spans.clone()),
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

    /// The names of every exported metric.
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

    /// Where the trace exporter counts spans (every outcome shows from the start).
    pub fn trace_counts(&self) -> crate::traces::Counts {
        let outcome = |o: &str| self.trace_spans.with_label_values(&[o]);
        crate::traces::Counts {
            exported: outcome("exported"),
            queue_full: outcome("queue_full"),
            export_failed: outcome("export_failed"),
        }
    }

    /// A request ended with `status` (0: no response was sent) on `backend`, if it got one.
    pub fn request(&self, route: &str, status: u16, backend: Option<&str>) {
        let status = match status {
            0 => "none".to_string(),
            code => code.to_string(),
        };
        let backend = backend.unwrap_or("-");
        let labels = [route, status.as_str(), backend];
        self.requests.with_label_values(&labels).inc();
        self.backend_requests.with_label_values(&[backend]).inc();
    }

    /// A policy placed a request of `text` routing text, believing the backend held
    /// `matched` of it.
    pub fn decision(&self, policy: &str, outcome: &str, matched: TextBytes, text: TextBytes) {
        self.decisions.with_label_values(&[policy, outcome]).inc();
        self.matched_bytes.inc_by(matched.0 as u64);
        self.text_bytes.inc_by(text.0 as u64);
    }

    /// What was seen of one response from `backend`: time to its first body byte, its whole
    /// duration, and the usage it reported.
    pub fn exchange(
        &self,
        backend: &str,
        first_byte: Option<Duration>,
        total: Duration,
        usage: Option<Usage>,
    ) {
        if let Some(first) = first_byte {
            self.ttfb
                .with_label_values(&[backend])
                .observe(first.as_secs_f64());
        }
        self.upstream_duration
            .with_label_values(&[backend])
            .observe(total.as_secs_f64());
        if let Some(usage) = usage {
            self.prompt_tokens
                .with_label_values(&[backend])
                .inc_by(usage.prompt);
            self.cached_tokens
                .with_label_values(&[backend])
                .inc_by(usage.cached);
        }
    }

    /// A prompt of a model with a tokenizer was routed in `mode` (`tokens` or `text`) for
    /// `reason` (`rendered`, or why it was not).
    pub fn prompt(&self, mode: &str, reason: &str) {
        self.prompts.with_label_values(&[mode, reason]).inc();
    }

    /// The router tokenized a prompt of `tokens` tokens, `reused` of them from its cache.
    pub fn tokenized(&self, tokens: usize, reused: usize) {
        let fresh = tokens.saturating_sub(reused) as u64;
        self.router_tokens
            .with_label_values(&["reused"])
            .inc_by(reused as u64);
        self.router_tokens
            .with_label_values(&["tokenized"])
            .inc_by(fresh);
    }

    /// Sets the token cache's gauges.
    pub fn set_token_cache(&self, bytes: usize, entries: usize) {
        self.token_cache_bytes.set(bytes as i64);
        self.token_cache_entries.set(entries as i64);
    }

    /// Sets the KV event metrics of one backend from its subscriber's counts (counters
    /// advance by what the counts grew).
    pub fn set_kv_events(&self, gauge: &KvEventGauge) {
        let advance = |counter: prometheus::IntCounter, now: u64| {
            counter.inc_by(now.saturating_sub(counter.get()));
        };
        for (kind, n) in ["stored", "removed", "cleared", "unknown"]
            .iter()
            .zip(gauge.events)
        {
            advance(self.kv_events.with_label_values(&[gauge.url, kind]), n);
        }
        for (kind, n) in ["undecoded", "gap", "replayed"].iter().zip(gauge.faults) {
            advance(
                self.kv_event_faults.with_label_values(&[gauge.url, kind]),
                n,
            );
        }
        let (gpu, other) = gauge.blocks;
        self.kv_event_blocks
            .with_label_values(&[gauge.url, "gpu"])
            .set(gpu as i64);
        self.kv_event_blocks
            .with_label_values(&[gauge.url, "other"])
            .set(other as i64);
        for mode in ["exact", "degraded", "connecting"] {
            let on = i64::from(mode == gauge.mode);
            self.kv_event_record
                .with_label_values(&[gauge.url, mode])
                .set(on);
        }
    }

    /// A request left the router's queue after waiting `waited`.
    pub fn queued(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// A request was refused with 503 overloaded, for `reason`.
    pub fn shed(&self, reason: &str) {
        self.shed.with_label_values(&[reason]).inc();
    }

    /// Sets the overload gauges: body bytes held and requests waiting for them, requests
    /// waiting in the queue.
    pub fn set_load(&self, buffered: usize, waiting_for_budget: usize, queued: usize) {
        self.buffered_bytes.set(buffered as i64);
        self.budget_waiting.set(waiting_for_budget as i64);
        self.queued.set(queued as i64);
    }

    /// An attempt failed in a way that allowed another backend to be tried.
    pub fn retry(&self) {
        self.retries.inc();
    }

    /// A request body of `bytes` was read.
    pub fn body(&self, bytes: usize) {
        self.body_bytes.observe(bytes as f64);
    }

    /// A config reload was tried; an applied one starts a new generation.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "ok" } else { "failed" };
        self.reloads.with_label_values(&[result]).inc();
    }

    /// A changed configuration was applied: the generation goes up by one.
    pub fn next_generation(&self) {
        self.generation.inc();
    }

    /// The configuration generation (1 at start).
    pub fn generation(&self) -> i64 {
        self.generation.get()
    }

    /// `n` notes of the shared conversation table went `direction` (`sent`, `received`,
    /// `dropped`).
    pub fn shared_notes(&self, direction: &str, n: u64) {
        self.shared_notes.with_label_values(&[direction]).inc_by(n);
    }

    /// Whether the shared table's server is subscribed to.
    pub fn shared_connected(&self, connected: bool) {
        self.shared_connected.set(i64::from(connected));
    }

    /// Prefix-index keys were evicted.
    pub fn evicted(&self, keys: KeyBytes) {
        self.evicted_bytes.inc_by(keys.0 as u64);
    }

    /// Sets the state gauges: every backend's load and readiness, every model's tree, the
    /// entries of every table the policy keeps. Backends and models not given are dropped.
    pub fn set_state(&self, backends: &[BackendGauge], trees: &[TreeGauge], tables: &[TableSize]) {
        self.inflight.reset();
        self.healthy.reset();
        self.live.reset();
        self.live_tokens.reset();
        self.kv_capacity.reset();
        for b in backends {
            if let Some((conversations, tokens)) = b.live {
                (self.live.with_label_values(&[b.url])).set(conversations as i64);
                (self.live_tokens.with_label_values(&[b.url])).set(tokens as i64);
            }
            if let Some(capacity) = b.capacity {
                (self.kv_capacity.with_label_values(&[b.url])).set(capacity as i64);
            }
            self.inflight
                .with_label_values(&[b.url])
                .set(b.inflight as i64);
            self.healthy
                .with_label_values(&[b.url])
                .set(i64::from(b.ready));
        }
        self.tree_bytes.reset();
        self.tree_nodes.reset();
        self.tree_heap_bytes.reset();
        for t in trees {
            self.tree_heap_bytes
                .with_label_values(&[t.model])
                .set(t.heap as i64);
            self.tree_bytes
                .with_label_values(&[t.model])
                .set(t.bytes as i64);
            self.tree_nodes
                .with_label_values(&[t.model])
                .set(t.nodes as i64);
        }
        for t in tables {
            (self.table_entries.with_label_values(&[t.name])).set(t.entries as i64);
        }
    }

    /// What one backend was sent and reported, for `/stats`.
    pub fn backend_totals(&self, backend: &str) -> BackendTotals {
        BackendTotals {
            requests: self.backend_requests.with_label_values(&[backend]).get(),
            prompt_tokens: self.prompt_tokens.with_label_values(&[backend]).get(),
            cached_tokens: self.cached_tokens.with_label_values(&[backend]).get(),
        }
    }

    /// Router-wide totals, for `/stats`.
    pub fn totals(&self) -> Totals {
        Totals {
            matched_bytes: self.matched_bytes.get(),
            text_bytes: self.text_bytes.get(),
            retries: self.retries.get(),
            generation: self.generation.get(),
        }
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

fn name(short: &str, help: &str) -> Opts {
    Opts::new(format!("prefix_router_{short}"), help)
}

fn seconds(short: &str, help: &str) -> HistogramOpts {
    let buckets = vec![
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    HistogramOpts::new(format!("prefix_router_{short}"), help).buckets(buckets)
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
        let dashboard = include_str!("../../../../conf/grafana-dashboard.json");
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
        stats.request("chat", 200, Some("http://b:1"));
        let usage = Usage {
            prompt: 10,
            cached: 4,
        };
        stats.exchange("http://b:1", None, Duration::from_millis(3), Some(usage));
        let text = String::from_utf8(stats.render()).unwrap();
        assert!(text.contains(
            "prefix_router_requests_total{backend=\"http://b:1\",route=\"chat\",status=\"200\"} 1"
        ));
        assert!(
            text.contains("prefix_router_backend_cached_tokens_total{backend=\"http://b:1\"} 4")
        );
        assert!(!text.contains("prefix_router_backend_requests"));
        let totals = stats.backend_totals("http://b:1");
        assert_eq!((totals.requests, totals.cached_tokens), (1, 4));
    }
}
