//! The clients, in parties: each party sends the sessions of a workload of its own under
//! a concurrency cap of its own, first come first served, its dispatcher starting its
//! next session when it gets a slot. Without flows one party sends the one workload; with
//! flows, one party per flow, as one tenant at one priority (tenants that share no
//! prompt, as the replays of `benches/tenants/noisy.sh` do not), and each flow's outcomes
//! summed.

use std::collections::VecDeque;

use prefix_router_core::flow::{Priority, TenantId};
use prefix_router_replay::{Percentiles, Plan, RequestOutcome, summarize};
use serde::Serialize;

use super::{SessionProgress, ShapedWorkload, Want};
use crate::prepare::RequestShapes;
use crate::scenario::Flows;

/// One party of clients.
pub(super) struct Party<'w> {
    /// Its workload.
    pub(super) plan: &'w Plan,
    pub(super) prepared: &'w RequestShapes,
    /// Where each of its sessions stands.
    pub(super) progress: Vec<SessionProgress>,
    /// Its requests' outcomes.
    pub(super) outcomes: Vec<RequestOutcome>,
    /// Its next session to start.
    next: usize,
    /// Its free concurrency slots.
    pub(super) free_slots: usize,
    /// Its clients waiting for a slot, in order.
    pub(super) waiting: VecDeque<Want>,
    /// Seconds its sessions start after their planned start.
    delay: f64,
    /// Whether it sends at all.
    sends: bool,
    /// Its tenant and priority, with flows.
    pub(super) flow: Option<(TenantId, Priority)>,
    /// Whether a run is about it.
    measured: bool,
    /// Its requests not ended yet.
    turns_left: usize,
    /// Its requests stopped before their answer.
    pub(super) preempted: u64,
}

impl<'w> Party<'w> {
    /// The parties sending `workloads`: the first, with `concurrency` slots, without
    /// `flows`; else one per flow, each sending its own workload.
    pub(super) fn split(
        workloads: &[ShapedWorkload<'w>],
        concurrency: usize,
        flows: Option<&Flows>,
    ) -> Vec<Party<'w>> {
        let Some(flows) = flows.filter(|f| !f.flows.is_empty()) else {
            return workloads
                .first()
                .map(|&w| Party::new(w, concurrency.max(1)))
                .into_iter()
                .collect();
        };
        (flows.flows.iter().zip(workloads))
            .map(|(flow, &workload)| Party {
                delay: flow.delay,
                sends: flow.concurrency > 0,
                flow: Some((TenantId::new(flow.tenant), flow.priority)),
                measured: flow.measured,
                ..Party::new(workload, flow.concurrency)
            })
            .collect()
    }

    fn new((plan, prepared): ShapedWorkload<'w>, concurrency: usize) -> Self {
        Party {
            plan,
            prepared,
            progress: vec![SessionProgress::default(); plan.sessions().len()],
            outcomes: Vec::new(),
            next: 0,
            free_slots: concurrency,
            waiting: VecDeque::new(),
            delay: 0.0,
            sends: true,
            flow: None,
            measured: false,
            turns_left: plan.sessions().iter().map(|s| s.turns().len()).sum(),
            preempted: 0,
        }
    }

    /// When its next session starts, seconds, if it has one and sends.
    pub(super) fn upcoming(&self) -> Option<f64> {
        let session = self.plan.sessions().get(self.next).filter(|_| self.sends)?;
        Some(session.start_ms() / 1000.0 + self.delay)
    }

    /// Its next session, now started.
    pub(super) fn start_next(&mut self) -> Option<usize> {
        let next = self.next;
        (next < self.plan.sessions().len()).then(|| {
            self.next += 1;
            next
        })
    }

    /// One of its requests ended.
    pub(super) fn ended(&mut self) {
        self.turns_left = self.turns_left.saturating_sub(1);
    }

    /// Its tenant and priority (one tenant at `normal` without flows).
    pub(super) fn identity(&self) -> (&TenantId, Priority) {
        (self.flow.as_ref()).map_or((TenantId::none(), Priority::Normal), |(t, p)| (t, *p))
    }
}

/// Whether every measured party's requests ended (never, without one).
pub(super) fn measured_done(parties: &[Party]) -> bool {
    let mut measured = parties.iter().filter(|p| p.measured).peekable();
    measured.peek().is_some() && measured.all(|p| p.turns_left == 0)
}

/// What one flow got in a run.
#[derive(Clone, Debug, Serialize)]
pub struct FlowResult {
    /// Its tenant.
    pub tenant: String,
    /// Its priority.
    pub priority: &'static str,
    /// Whether the run was about it.
    pub measured: bool,
    /// Its requests answered.
    pub ok: u64,
    /// Its requests refused by the router (503: a full queue, or one waited too long).
    pub shed: u64,
    /// Its requests that failed otherwise (the engines' refusals).
    pub failed: u64,
    /// Its requests stopped before their answer and placed again.
    pub preempted: u64,
    /// Time to first token, ms.
    pub ttft_ms: Option<Percentiles>,
    /// The slowest first turn of a session, ms.
    pub first_turn_max_ms: Option<f64>,
    /// The 99th percentile of the later turns' TTFT, ms.
    pub later_turns_p99_ms: Option<f64>,
    /// Cached over prompt tokens of its answered requests.
    pub hit_rate: Option<f64>,
}

/// Each flow's result, for the `parties` of `flows`.
pub(super) fn results(parties: &[Party], flows: Option<&Flows>) -> Vec<FlowResult> {
    if flows.is_none_or(|f| f.flows.is_empty()) {
        return Vec::new();
    }
    parties
        .iter()
        .map(|p| summed(p, p.outcomes.iter()))
        .collect()
}

/// The outcomes a run reports: the first measured party's, else the first party's.
pub(super) fn main_outcomes(parties: Vec<Party>) -> Vec<RequestOutcome> {
    let main = parties.iter().position(|p| p.measured).unwrap_or(0);
    (parties.into_iter().nth(main)).map_or_else(Vec::new, |p| p.outcomes)
}

/// A party's result from its outcomes.
fn summed<'o>(party: &Party, outcomes: impl Iterator<Item = &'o RequestOutcome>) -> FlowResult {
    let (tenant, priority) = party.identity();
    let mut result = FlowResult {
        tenant: tenant.to_string(),
        priority: priority.label(),
        measured: party.measured,
        ok: 0,
        shed: 0,
        failed: 0,
        preempted: party.preempted,
        ttft_ms: None,
        first_turn_max_ms: None,
        later_turns_p99_ms: None,
        hit_rate: None,
    };
    let (mut ttfts, mut later, mut cached, mut prompt) = (Vec::new(), Vec::new(), 0u64, 0u64);
    for o in outcomes {
        let x = &o.exchange;
        match x.error.as_deref() {
            None => result.ok += 1,
            Some("http_503") => result.shed += 1,
            Some(_) => result.failed += 1,
        }
        if let Some(ttft) = x.ttft.map(|t| t.as_secs_f64() * 1000.0) {
            ttfts.push(ttft);
            if o.turn == 0 {
                result.first_turn_max_ms = Some(result.first_turn_max_ms.unwrap_or(0.0).max(ttft));
            } else {
                later.push(ttft);
            }
        }
        if let Some(usage) = &x.usage {
            cached += usage.cached_tokens.unwrap_or(0);
            prompt += usage.prompt_tokens;
        }
    }
    result.ttft_ms = summarize(ttfts);
    result.later_turns_p99_ms = summarize(later).map(|p| p.p99);
    result.hit_rate = (prompt > 0).then(|| cached as f64 / prompt as f64);
    result
}
