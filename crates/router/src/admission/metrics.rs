//! What admission counts: requests shed and why, time waited in the queue, and (set before
//! each scrape) the body bytes held and the requests waiting.

use std::time::Duration;

use prometheus::{Histogram, IntGauge, IntGaugeVec};

use super::{Budget, Queue};
use crate::stats::{Counters, Registry, label_set};
use crate::tenants::Priority;

label_set! {
    /// Why a request was shed before reaching a backend.
    pub enum ShedReason {
        /// Its body did not get buffer budget within `admission_timeout`.
        Budget => "budget",
        /// Every backend was at its limit and the router's queue was full.
        QueueFull => "queue_full",
        /// It waited in the router's queue for `queue_timeout`.
        QueueTimeout => "queue_timeout",
    }
}

impl ShedReason {
    /// What was full, for the error message.
    pub fn explain(self) -> &'static str {
        match self {
            ShedReason::Budget => "the router holds as many request bodies as it may",
            ShedReason::QueueFull => "every backend is at its limit and the queue is full",
            ShedReason::QueueTimeout => {
                "every backend stayed at its limit while the request waited"
            }
        }
    }
}

/// Admission's metrics.
pub struct AdmissionMetrics {
    shed: Counters<ShedReason>,
    queue_wait: Histogram,
    buffered_bytes: IntGauge,
    budget_waiting: IntGauge,
    queued: IntGauge,
    queued_by_priority: IntGaugeVec,
}

impl AdmissionMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let r = registry;
        AdmissionMetrics {
            shed: r.counters(
                "shed_total",
                "Requests refused with 503 overloaded, by reason",
                "reason",
            ),
            queue_wait: r.seconds(
                "queue_wait_seconds",
                "Time requests waited in the router's queue",
            ),
            buffered_bytes: r.gauge("buffered_bytes", "Request body bytes held"),
            budget_waiting: r.gauge(
                "budget_waiting_requests",
                "Requests waiting for body budget",
            ),
            queued: r.gauge("queued_requests", "Requests waiting in the router's queue"),
            queued_by_priority: r.gauge_vec(
                "queued_requests_by_priority",
                "Requests waiting in the router's queue, by priority",
                &["priority"],
            ),
        }
    }

    /// A request was refused with 503 overloaded.
    pub fn shed(&self, why: ShedReason) {
        self.shed.inc(why);
    }

    /// A request left the queue after waiting `waited`.
    pub fn waited(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// Sets the gauges from the budget and the queue (its depth by priority) now.
    pub fn set(&self, budget: &Budget, queue: &Queue, by_priority: [usize; 3]) {
        self.buffered_bytes.set(budget.held() as i64);
        self.budget_waiting.set(budget.waiting() as i64);
        self.queued.set(queue.len() as i64);
        for (priority, n) in Priority::ALL.iter().zip(by_priority) {
            (self
                .queued_by_priority
                .with_label_values(&[priority.label()]))
            .set(n as i64);
        }
    }
}
