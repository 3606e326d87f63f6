//! What the prefix index and the policy's tables hold: key bytes evicted, and gauges set
//! from snapshots before each scrape.

use prefix_router_core::policy::TableSize;
use prefix_router_core::tree::TreeStats;
use prefix_router_core::units::KeyBytes;
use prometheus::{IntCounter, IntGaugeVec};

use super::Registry;

/// The index's and the tables' metrics.
pub struct IndexMetrics {
    evicted_bytes: IntCounter,
    tree_bytes: IntGaugeVec,
    tree_nodes: IntGaugeVec,
    tree_heap_bytes: IntGaugeVec,
    table_entries: IntGaugeVec,
}

impl IndexMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let per_model = |short, help| registry.gauge_vec(short, help, &["model"]);
        IndexMetrics {
            evicted_bytes: registry
                .counter("tree_evicted_bytes_total", "Prefix-index key bytes evicted"),
            tree_bytes: per_model(
                "tree_bytes",
                "Prefix-index key bytes (8 per 16-token block)",
            ),
            tree_nodes: per_model("tree_nodes", "Prefix-index nodes"),
            tree_heap_bytes: per_model(
                "tree_heap_bytes",
                "Prefix-index heap bytes, nodes and keys",
            ),
            table_entries: registry.gauge_vec(
                "table_entries",
                "Entries of the tables the policy keeps (sessions, conversations)",
                &["table"],
            ),
        }
    }

    /// Prefix-index keys were evicted.
    pub fn evicted(&self, keys: KeyBytes) {
        self.evicted_bytes.inc_by(keys.0 as u64);
    }

    /// Sets the gauges: every model's tree (models not given are dropped), every table.
    pub fn set(&self, index: &TreeStats, tables: &[TableSize]) {
        let families = [&self.tree_bytes, &self.tree_nodes, &self.tree_heap_bytes];
        families.iter().for_each(|f| f.reset());
        for m in &index.models {
            let model = [m.model.as_str()];
            self.tree_bytes
                .with_label_values(&model)
                .set(m.bytes as i64);
            self.tree_nodes
                .with_label_values(&model)
                .set(m.nodes as i64);
            self.tree_heap_bytes
                .with_label_values(&model)
                .set(m.heap as i64);
        }
        for t in tables {
            (self.table_entries.with_label_values(&[t.name])).set(t.entries as i64);
        }
    }
}
