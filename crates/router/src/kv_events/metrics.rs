//! What the KV event subscribers saw, by backend, set from their counts before each scrape
//! (counters advance by what the counts grew): events applied by type, faults (batches not
//! decoded, gaps, gaps replayed), blocks held by medium, and each record's mode.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec};

use super::Record;
use crate::stats::{Label, Registry, label_set};

label_set! {
    /// How far a record is trusted.
    pub enum RecordMode {
        /// Connected and whole: it says what the backend holds.
        Exact => "exact",
        /// It may miss blocks, or hold blocks the backend lost.
        Degraded => "degraded",
        /// Not connected yet.
        Connecting => "connecting",
    }
}

/// The event types counted, in the order of `SubscriberCounts::events`.
const EVENTS: [&str; 4] = ["stored", "removed", "cleared", "unknown"];

/// The KV event metrics.
pub struct KvEventMetrics {
    events: IntCounterVec,
    faults: IntCounterVec,
    blocks: IntGaugeVec,
    mode: IntGaugeVec,
}

impl KvEventMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let r = registry;
        KvEventMetrics {
            events: r.counter_vec(
                "kv_events_total",
                "KV events applied, by backend and type",
                &["backend", "type"],
            ),
            faults: r.counter_vec(
                "kv_event_faults_total",
                "KV event batches not decoded, gaps in their sequence numbers, and gaps \
                 filled from the replay socket, by backend",
                &["backend", "kind"],
            ),
            blocks: r.gauge_vec(
                "kv_event_blocks",
                "Blocks each backend holds by its KV events, by medium",
                &["backend", "medium"],
            ),
            mode: r.gauge_vec(
                "kv_event_record",
                "1 for each backend's KV event record mode (exact, degraded, connecting)",
                &["backend", "mode"],
            ),
        }
    }

    /// Sets the metrics of the backend at `url` from its record.
    pub fn set(&self, url: &str, record: &Record) {
        let advance = |counter: IntCounter, now: &AtomicU64| {
            counter.inc_by(now.load(Relaxed).saturating_sub(counter.get()));
        };
        let counts = &record.counts;
        for (kind, n) in EVENTS.iter().zip(&counts.events) {
            advance(self.events.with_label_values(&[url, kind]), n);
        }
        let faults = [
            ("undecoded", &counts.decode_failures),
            ("gap", &counts.gaps),
            ("replayed", &counts.replays),
        ];
        for (kind, n) in faults {
            advance(self.faults.with_label_values(&[url, kind]), n);
        }
        let (gpu, other) = record.by_medium();
        self.blocks.with_label_values(&[url, "gpu"]).set(gpu as i64);
        self.blocks
            .with_label_values(&[url, "other"])
            .set(other as i64);
        let now = record.mode();
        for mode in RecordMode::ALL {
            let on = i64::from(*mode == now);
            self.mode.with_label_values(&[url, mode.label()]).set(on);
        }
    }
}
