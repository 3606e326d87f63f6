//! What the admin endpoints show, built from snapshots of the fleet, the selector and the
//! stats: the gauges refreshed before a scrape, `/stats` and `/workers` as JSON.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::fleet::FleetGauges;
use crate::state::State;

/// Sets the gauges of every part (fleet, index and tables, admission, tenants, token
/// cache, KV events) from current snapshots.
pub fn refresh_gauges(state: &State, fleet: &FleetGauges) {
    let snapshot = state.fleet.snapshot();
    let live = (state.selector).live(snapshot.backends.iter().map(|b| b.id));
    fleet.set(&snapshot, live.as_deref());
    let tree = (state.selector.index()).map_or_else(Default::default, |i| i.stats());
    (state.stats.index).set(&tree, &state.selector.tables());
    let (by_priority, by_tenant) = state.queue.depths();
    (state.admission).set(&state.budget, &state.queue, by_priority);
    state.tenancy.set_gauges(&by_tenant);
    state.tokenizers.set_gauges();
    state.records.set_gauges(&snapshot);
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The backends with health, load and tree bytes (`GET /workers`).
pub fn workers(state: &State) -> Value {
    let limit = state.live().limits.max_inflight_per_backend;
    let index = state.selector.index();
    let tree_bytes: HashMap<_, _> = index
        .map(|i| i.stats().backends.into_iter().collect())
        .unwrap_or_default();
    let rows: Vec<Value> = state
        .fleet
        .snapshot()
        .backends
        .iter()
        .map(|b| {
            json!({
                "url": b.worker.url, "role": b.worker.role.name(),
                "address": b.addr.to_string(), "ready": b.is_ready(),
                "healthy": b.is_healthy(), "ejected": b.is_ejected(), "inflight": b.load(),
                "pending_prefill_bytes": b.account.pending().0,
                "kv_tokens": b.account.capacity().map(|t| t.0),
                "kv_block_tokens": b.account.block().map(|t| t.0),
                "text_bytes_per_token": b.account.density().0,
                "slots": b.account.sequences(),
                "published": b.account.published().map(|p| json!({
                    "running": p.running, "waiting": p.waiting, "kv_usage": p.kv_usage,
                })),
                "index_budget_tokens": index.map(|i| i.budget(b.id).0),
                "limit": (limit > 0).then_some(limit),
                "tree_bytes": tree_bytes.get(&b.id).copied().unwrap_or(0),
            })
        })
        .collect();
    json!({ "workers": rows })
}

/// Entries of each table the policy keeps, by name.
fn tables(state: &State) -> Value {
    let sizes = state.selector.tables();
    Value::Object(
        sizes
            .iter()
            .map(|t| (t.name.into(), t.entries.into()))
            .collect(),
    )
}

/// Key figures, per backend: requests, predicted and delivered hit rates (`GET /stats`).
pub fn stats(state: &State) -> Value {
    let (mut prompt_all, mut cached_all) = (0, 0);
    let backends: Vec<Value> = state
        .fleet
        .snapshot()
        .backends
        .iter()
        .map(|b| {
            let url = b.worker.url.as_str();
            let t = state.stats.backend_totals(url);
            (prompt_all, cached_all) = (prompt_all + t.prompt_tokens, cached_all + t.cached_tokens);
            json!({
                "url": url, "ready": b.is_ready(), "inflight": b.load(), "requests": t.requests,
                "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
                "hit_rate": ratio(t.cached_tokens, t.prompt_tokens),
            })
        })
        .collect();
    let totals = state.stats.totals();
    json!({
        "policy": state.policy_name,
        "config_generation": totals.generation,
        "tables": tables(state),
        "predicted_hit_rate": ratio(totals.matched_bytes, totals.text_bytes),
        "delivered_hit_rate": ratio(cached_all, prompt_all),
        "retries": totals.retries,
        "backends": backends,
    })
}
