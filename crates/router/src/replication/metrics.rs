//! What replication counts: notes sent, received and dropped (a full outbox), and whether
//! the shared table's server is subscribed to.

use prometheus::IntGauge;

use crate::stats::{Counters, Registry, label_set};

label_set! {
    /// Which way notes went.
    pub(super) enum Direction {
        Sent => "sent",
        Received => "received",
        /// Not sent: the outbox was full.
        Dropped => "dropped",
    }
}

/// Replication's metrics.
pub struct ReplicationMetrics {
    pub(super) notes: Counters<Direction>,
    pub(super) connected: IntGauge,
}

impl ReplicationMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        ReplicationMetrics {
            notes: registry.counters(
                "shared_table_notes_total",
                "Conversation placements exchanged with other router replicas",
                "direction",
            ),
            connected: registry.gauge(
                "shared_table_connected",
                "1 while subscribed to the shared table's server",
            ),
        }
    }
}
