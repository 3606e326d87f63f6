//! The clients, in parties: each party sends some of the workload's sessions under a
//! concurrency cap of its own, first come first served, its dispatcher starting its next
//! session when it gets a slot. Without flows one party sends every session; with flows,
//! one party per flow, as one tenant at one priority, and each flow's outcomes summed.

use std::collections::VecDeque;

use prefix_router_core::flow::Priority;
use prefix_router_replay::{Outcome, Percentiles, Plan, summarize};
use serde::Serialize;

use super::Want;
use crate::scenario::Flows;

/// One party of clients.
pub(super) struct Party {
    /// Its sessions (the plan's numbers), in the plan's order.
    sessions: Vec<usize>,
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
    pub(super) flow: Option<(&'static str, Priority)>,
    /// Whether a run is about it.
    measured: bool,
    /// Its requests not ended yet.
    turns_left: usize,
    /// Its requests stopped before their answer.
    pub(super) preempted: u64,
}

impl Party {
    /// The parties sending `plan`'s sessions: one with `concurrency` slots without
    /// `flows`; else one per flow, each taking sessions in turn in the plan's order, as
    /// many as its share of the flows' sessions.
    pub(super) fn split(plan: &Plan, concurrency: usize, flows: Option<&Flows>) -> Vec<Party> {
        let turns = |sessions: &[usize]| {
            let sessions = sessions.iter().map(|&s| plan.sessions()[s].turns().len());
            sessions.sum()
        };
        let all: Vec<usize> = (0..plan.sessions().len()).collect();
        let Some(flows) = flows.filter(|f| !f.flows.is_empty()) else {
            return vec![Party {
                turns_left: turns(&all),
                ..Party::new(all, concurrency.max(1))
            }];
        };
        let mut taken: Vec<Vec<usize>> = vec![Vec::new(); flows.flows.len()];
        for session in all {
            let share =
                |f: usize| (taken[f].len() + 1) as f64 / flows.flows[f].sessions.max(1) as f64;
            let least = (0..taken.len()).min_by(|&a, &b| share(a).total_cmp(&share(b)));
            taken[least.unwrap_or(0)].push(session);
        }
        (flows.flows.iter().zip(taken))
            .map(|(flow, sessions)| Party {
                delay: flow.delay,
                sends: flow.concurrency > 0,
                flow: Some((flow.tenant, flow.priority)),
                measured: flow.measured,
                turns_left: turns(&sessions),
                ..Party::new(sessions, flow.concurrency)
            })
            .collect()
    }

    fn new(sessions: Vec<usize>, concurrency: usize) -> Self {
        Party {
            sessions,
            next: 0,
            free_slots: concurrency,
            waiting: VecDeque::new(),
            delay: 0.0,
            sends: true,
            flow: None,
            measured: false,
            turns_left: 0,
            preempted: 0,
        }
    }

    /// When its next session starts, seconds, if it has one and sends.
    pub(super) fn upcoming(&self, plan: &Plan) -> Option<f64> {
        let session = self.sessions.get(self.next).filter(|_| self.sends)?;
        Some(plan.sessions()[*session].start_ms() / 1000.0 + self.delay)
    }

    /// Its next session, now started.
    pub(super) fn start_next(&mut self) -> Option<usize> {
        let session = self.sessions.get(self.next).copied()?;
        self.next += 1;
        Some(session)
    }

    /// One of its requests ended.
    pub(super) fn ended(&mut self) {
        self.turns_left = self.turns_left.saturating_sub(1);
    }

    /// Its tenant and priority (one tenant at `normal` without flows).
    pub(super) fn identity(&self) -> (&'static str, Priority) {
        self.flow.unwrap_or(("", Priority::Normal))
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
    /// Cached over prompt tokens of its answered requests.
    pub hit_rate: Option<f64>,
}

/// Each flow's result from the run's `outcomes`, for the `parties` of `flows`.
pub(super) fn results(
    parties: &[Party],
    outcomes: &[Outcome],
    flows: Option<&Flows>,
) -> Vec<FlowResult> {
    if flows.is_none_or(|f| f.flows.is_empty()) {
        return Vec::new();
    }
    let mut of = vec![
        usize::MAX;
        outcomes
            .iter()
            .map(|o| o.session as usize + 1)
            .max()
            .unwrap_or(0)
    ];
    for (p, party) in parties.iter().enumerate() {
        for &s in &party.sessions {
            if let Some(slot) = of.get_mut(s) {
                *slot = p;
            }
        }
    }
    (parties.iter().enumerate())
        .map(|(p, party)| {
            let mine = outcomes
                .iter()
                .filter(|o| of.get(o.session as usize) == Some(&p));
            summed(party, mine)
        })
        .collect()
}

/// A party's result from its outcomes.
fn summed<'o>(party: &Party, outcomes: impl Iterator<Item = &'o Outcome>) -> FlowResult {
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
        hit_rate: None,
    };
    let (mut ttfts, mut cached, mut prompt) = (Vec::new(), 0u64, 0u64);
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
            }
        }
        if let Some(usage) = &x.usage {
            cached += usage.cached_tokens.unwrap_or(0);
            prompt += usage.prompt_tokens;
        }
    }
    result.ttft_ms = summarize(ttfts);
    result.hit_rate = (prompt > 0).then(|| cached as f64 / prompt as f64);
    result
}
