//! The fleet's metrics, set from a snapshot before each scrape: each backend's requests in
//! flight, readiness, ejection (and its ejections so far, a counter advanced by what the
//! backend counted), KV capacity, and (when the policy keeps a conversation table) its live
//! conversations and their tokens. Backends gone from the snapshot are dropped.

use prefix_router_core::policy::Live;
use prometheus::{IntCounterVec, IntGaugeVec};

use super::Snapshot;
use crate::stats::{Label, Registry};

/// The fleet's gauges, by backend.
pub struct FleetGauges {
    inflight: IntGaugeVec,
    healthy: IntGaugeVec,
    live: IntGaugeVec,
    live_tokens: IntGaugeVec,
    kv_capacity: IntGaugeVec,
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
}

impl FleetGauges {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let per_backend = |short, help| registry.gauge_vec(short, help, &["backend"]);
        FleetGauges {
            inflight: per_backend("inflight_requests", "Requests in flight"),
            healthy: per_backend("backend_healthy", "1 when the backend is ready"),
            live: per_backend(
                "backend_live_conversations",
                "Conversations expected back on the backend (kv_aware's conversation table)",
            ),
            live_tokens: per_backend(
                "backend_live_tokens",
                "Prompt tokens of the backend's live conversations: the working set its KV \
                 must hold (text bytes / 4 in text mode)",
            ),
            kv_capacity: per_backend(
                "backend_kv_capacity_tokens",
                "KV cache capacity the backend published, tokens",
            ),
            ejected: per_backend("backend_ejected", "1 while outlier detection keeps the backend out"),
            ejections: registry.counter_vec(
                "backend_ejections_total",
                "Outlier ejections, by backend and reason (5xx answers or failed exchanges in a row)",
                &["backend", "reason"],
            ),
        }
    }

    /// Sets them from `snapshot`, and `live` (one entry per backend, in its order).
    pub fn set(&self, snapshot: &Snapshot, live: Option<&[Live]>) {
        let families = [
            &self.inflight,
            &self.healthy,
            &self.live,
            &self.live_tokens,
            &self.kv_capacity,
            &self.ejected,
        ];
        families.iter().for_each(|f| f.reset());
        for (i, b) in snapshot.backends.iter().enumerate() {
            let url = [b.worker.url.as_str()];
            self.inflight.with_label_values(&url).set(b.load() as i64);
            self.healthy
                .with_label_values(&url)
                .set(i64::from(b.is_ready()));
            if let Some(live) = live.and_then(|l| l.get(i)) {
                (self.live.with_label_values(&url)).set(live.conversations as i64);
                let tokens = b.account.density().tokens(live.bytes).0 as i64;
                self.live_tokens.with_label_values(&url).set(tokens);
            }
            self.ejected
                .with_label_values(&url)
                .set(i64::from(b.is_ejected()));
            for (reason, n) in b.ejections() {
                let counter = self.ejections.with_label_values(&[url[0], reason.label()]);
                counter.inc_by(n.saturating_sub(counter.get()));
            }
            if let Some(capacity) = b.account.capacity() {
                (self.kv_capacity.with_label_values(&url)).set(capacity.0 as i64);
            }
        }
    }
}
