//! What replication counts: notes sent, received and dropped (a full outbox), and whether
//! the shared table's server is subscribed to.

use prometheus::IntGauge;

use crate::stats::{Counters, Label, Registry};

/// Which way notes went.
#[derive(Clone, Copy)]
pub(super) enum Direction {
    Sent,
    Received,
    /// Not sent: the outbox was full.
    Dropped,
}

impl Label for Direction {
    const ALL: &'static [Self] = &[Direction::Sent, Direction::Received, Direction::Dropped];
    fn label(self) -> &'static str {
        match self {
            Direction::Sent => "sent",
            Direction::Received => "received",
            Direction::Dropped => "dropped",
        }
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
