//! What the admin endpoints show, built from snapshots of the fleet, the selector and the
//! stats: the gauges refreshed before a scrape, `/stats` and `/workers` as JSON.

use std::collections::HashMap;

use prometheus::core::Collector;
use serde_json::{Value, json};

use crate::proxy::State;
use crate::stats::Stats;

/// Sets the state gauges (in-flight, health, tree size, sessions) from current snapshots.
pub fn refresh_gauges(state: &State) {
    let stats = &state.stats;
    stats.inflight.reset();
    stats.healthy.reset();
    for backend in &state.fleet.snapshot().backends {
        let url = backend.worker.url.as_str();
        stats
            .inflight
            .with_label_values(&[url])
            .set(backend.load() as i64);
        stats
            .healthy
            .with_label_values(&[url])
            .set(i64::from(backend.is_ready()));
    }
    stats.tree_bytes.reset();
    stats.tree_nodes.reset();
    if let Some(tree) = state.selector.tree_stats() {
        for model in &tree.models {
            stats
                .tree_bytes
                .with_label_values(&[model.model.as_str()])
                .set(model.bytes as i64);
            stats
                .tree_nodes
                .with_label_values(&[model.model.as_str()])
                .set(model.nodes as i64);
        }
    }
    stats.sessions.set(state.selector.sessions() as i64);
}

/// Requests served per backend label, over all routes and statuses.
fn requests_by_backend(stats: &Stats) -> HashMap<String, u64> {
    let mut totals = HashMap::new();
    for family in stats.requests.collect() {
        for metric in family.get_metric() {
            let backend = metric.get_label().iter().find(|l| l.name() == "backend");
            if let Some(label) = backend {
                *totals.entry(label.value().to_string()).or_default() +=
                    metric.get_counter().get_value() as u64;
            }
        }
    }
    totals
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The backends with health, load and tree bytes (`GET /workers`).
pub fn workers(state: &State) -> Value {
    let tree_bytes: HashMap<_, _> = state
        .selector
        .tree_stats()
        .map(|t| t.backends.into_iter().collect())
        .unwrap_or_default();
    let rows: Vec<Value> = state
        .fleet
        .snapshot()
        .backends
        .iter()
        .map(|b| {
            json!({
                "url": b.worker.url, "address": b.addr.to_string(), "ready": b.is_ready(),
                "healthy": b.is_healthy(), "inflight": b.load(), "pending_prefill_bytes": b.pending_prefill(),
                "tree_bytes": tree_bytes.get(&b.id).copied().unwrap_or(0),
            })
        })
        .collect();
    json!({ "workers": rows })
}

/// Key figures, per backend: requests, predicted and delivered hit rates (`GET /stats`).
pub fn stats(state: &State) -> Value {
    let stats = &state.stats;
    let requests = requests_by_backend(stats);
    let (mut prompt_all, mut cached_all) = (0, 0);
    let backends: Vec<Value> = state
        .fleet
        .snapshot()
        .backends
        .iter()
        .map(|b| {
            let url = b.worker.url.as_str();
            let prompt = stats.prompt_tokens.with_label_values(&[url]).get();
            let cached = stats.cached_tokens.with_label_values(&[url]).get();
            (prompt_all, cached_all) = (prompt_all + prompt, cached_all + cached);
            json!({
                "url": url, "ready": b.is_ready(), "inflight": b.load(),
                "requests": requests.get(url).copied().unwrap_or(0),
                "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": ratio(cached, prompt),
            })
        })
        .collect();
    json!({
        "policy": state.policy_name,
        "config_generation": stats.generation.get(),
        "sessions": state.selector.sessions(),
        "predicted_hit_rate": ratio(stats.matched_bytes.get(), stats.text_bytes.get()),
        "delivered_hit_rate": ratio(cached_all, prompt_all),
        "retries": stats.retries.get(),
        "backends": backends,
    })
}
