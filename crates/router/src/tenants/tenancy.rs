//! What the data plane asks of tenants: admit a request under its tenant's rate limits
//! (counting it in its tenant's share), settle what it really cost, and the metrics,
//! labelled by the tenants of the file only.

use std::sync::OnceLock;
use std::time::Instant;

use std::collections::HashMap;

use prefix_router_core::flow;
use prefix_router_core::flow::{FlowControl, NO_FLOW_CONTROL, TenantId};
use prefix_router_core::ledger::Account;
use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGaugeVec};

use super::Shares;
use super::rate::{Limit, RateLimits, Verdict};
use super::{Identity, Priority};
use crate::stats::Registry;

/// A request admitted under its tenant's limits: what to settle when it ends.
#[derive(Debug)]
pub struct Charge {
    tenant: TenantId,
    estimate: u64,
    /// Whether the tenant has rate limits.
    limited: bool,
}

/// The rate limits' state and the tenants' metrics.
pub struct Tenancy {
    limits: RateLimits,
    shares: Shares,
    requests: IntCounterVec,
    limited: IntCounterVec,
    tokens: IntCounterVec,
    shed: IntCounterVec,
    preempted: IntCounterVec,
    held: IntGaugeVec,
    queued: IntGaugeVec,
    waits: HistogramVec,
    unknown: IntCounter,
}

impl Tenancy {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Self {
        Tenancy {
            limits: RateLimits::default(),
            shares: Shares::default(),
            requests: registry.counter_vec(
                "tenant_requests_total",
                "Requests admitted, by tenant and priority (tenants of the tenants file)",
                &["tenant", "priority"],
            ),
            limited: registry.counter_vec(
                "tenant_rate_limited_total",
                "Requests refused with 429, by tenant and the limit reached",
                &["tenant", "limit"],
            ),
            tokens: registry.counter_vec(
                "tenant_tokens_total",
                "Prompt and completion tokens served, by tenant (as the answers reported)",
                &["tenant"],
            ),
            shed: registry.counter_vec(
                "tenant_shed_total",
                "Requests shed with 503 before reaching a backend, by tenant, priority and reason",
                &["tenant", "priority", "reason"],
            ),
            preempted: registry.counter_vec(
                "tenant_preempted_total",
                "Requests stopped before their answer for one that outranks them (and placed \
                 again), by tenant and priority",
                &["tenant", "priority"],
            ),
            held: registry.gauge_vec(
                "tenant_held_requests",
                "Requests in flight or waiting in the router's queue, by tenant",
                &["tenant"],
            ),
            queued: registry.gauge_vec(
                "tenant_queued_requests",
                "Requests waiting in the router's queue, by tenant",
                &["tenant"],
            ),
            waits: registry.seconds_by(
                "tenant_queue_wait_seconds",
                "Time requests waited in the router's queue, by tenant",
                "tenant",
            ),
            unknown: registry.counter(
                "unknown_api_keys_total",
                "Requests refused with 401: a key in no tenant's list",
            ),
        }
    }

    /// A request was refused for its key.
    pub fn unknown_key(&self) {
        self.unknown.inc();
    }

    /// Admits a request of `identity` estimated at `tokens` prompt tokens, or the verdict
    /// that refuses it.
    pub fn admit(&self, identity: &Identity, tokens: u64) -> Result<Option<Charge>, Verdict> {
        let Some(tenant) = identity.tenant else {
            return Ok(None);
        };
        let name = tenant.name.as_str();
        let limited = tenant.requests_per_minute > 0 || tenant.tokens_per_minute > 0;
        if limited {
            let verdict = self.limits.admit(tenant, tokens, now());
            if let Some(limit) = verdict.refused {
                let limit = match limit {
                    Limit::Requests => "requests",
                    Limit::Tokens => "tokens",
                };
                self.limited.with_label_values(&[name, limit]).inc();
                return Err(verdict);
            }
        }
        let priority: Priority = identity.priority;
        (self.requests.with_label_values(&[name, priority.label()])).inc();
        Ok(Some(Charge {
            tenant: tenant.name.clone(),
            estimate: tokens,
            limited,
        }))
    }

    /// Sets the gauges from the shares and the queue's depth by tenant (`queued`) now.
    pub fn set_gauges(&self, queued: &HashMap<TenantId, usize>) {
        self.held.reset();
        self.queued.reset();
        for (tenant, held) in self.shares.held() {
            self.held.with_label_values(&[&tenant]).set(held as i64);
            let waiting = queued.get(&tenant).copied().unwrap_or(0);
            self.queued
                .with_label_values(&[&tenant])
                .set(waiting as i64);
        }
    }

    /// A request of `tenant` (none without a tenants file) left the queue after
    /// `waited`.
    pub fn waited(&self, tenant: &str, waited: std::time::Duration) {
        if !tenant.is_empty() {
            (self.waits.with_label_values(&[tenant])).observe(waited.as_secs_f64());
        }
    }

    /// A request of `tenant` at `priority` was stopped for one that outranks it.
    pub fn preempted(&self, tenant: &str, priority: Priority) {
        (self
            .preempted
            .with_label_values(&[tenant, priority.label()]))
        .inc();
    }

    /// A request of `identity` was shed for `reason` (a label of admission's sheds).
    pub fn shed(&self, identity: &Identity, reason: &str) {
        if let Some(tenant) = identity.tenant {
            let priority = identity.priority.label();
            (self
                .shed
                .with_label_values(&[&tenant.name, priority, reason]))
            .inc();
        }
    }

    /// Counts a tenant as active for `after` past its last request's end (the tenants
    /// file's `active_after`).
    pub fn set_active_after(&self, after: std::time::Duration) {
        self.shares.set_active_after(after);
    }

    /// The flow control a request of `identity` is weighed by: the tenants' fair shares,
    /// or none without a tenants file.
    pub fn flow_control(&self, identity: &Identity) -> &dyn FlowControl {
        match identity.tenant {
            Some(_) => &self.shares,
            None => &NO_FLOW_CONTROL,
        }
    }

    /// Flow control's steps after a read of every one of `accounts` ([`flow::after_read`]):
    /// holds shared, KV kept for light flows, and with `standing` slots what the engines
    /// queue past their holds taken back, `room` at most; how many were.
    pub fn after_read(&self, accounts: &[&Account], room: usize, standing: usize) -> usize {
        flow::after_read(&self.shares, accounts, room, standing)
    }

    /// A request admitted as `charge` cost `tokens` (prompt and completion), as its answer
    /// reported. The limits are settled before the metric counts it.
    pub fn settle(&self, charge: &Charge, tokens: u64) {
        if charge.limited {
            (self.limits).settle(&charge.tenant, charge.estimate, tokens, now());
        }
        self.tokens
            .with_label_values(&[&charge.tenant])
            .inc_by(tokens);
    }
}

/// Seconds since the first call: the clock of the rate windows.
fn now() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs()
}
