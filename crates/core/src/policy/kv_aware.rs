//! `kv_aware` (experimental knobs while it is tuned in the lab).

use std::cmp::Reverse;
use std::time::Duration;

use super::footprint::{Footprints, MAX_CONVERSATIONS};
use super::prefix::{Ask, PrefixPolicy, Rule};
use super::{Decision, Outcome, Policy, PolicyParams, Request, Ties};
use crate::BackendId;

/// The rule.
pub struct KvAware {
    ties: Ties,
    footprints: Footprints,
    knobs: Knobs,
}

#[derive(Clone, Copy, Debug)]
struct Knobs {
    queue: f64,
    new_prefill: f64,
}

fn knob(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn build(params: &PolicyParams) -> Box<dyn Policy> {
    let horizon = Duration::from_secs_f64(knob("KV_HORIZON", 60.0));
    let rule = KvAware {
        ties: Ties::new(params.seed),
        footprints: Footprints::new(horizon, MAX_CONVERSATIONS, params.clock.clone()),
        knobs: Knobs {
            queue: knob("KV_QUEUE", 0.3),
            new_prefill: knob("KV_NEW_PREFILL", 0.0),
        },
    };
    Box::new(PrefixPolicy::new(params, rule))
}

impl Rule for KvAware {
    fn decide(&self, ask: &Ask) -> Decision {
        let (matches, candidates) = (ask.matches, ask.candidates);
        let k = self.knobs;
        let total = matches.total();
        let anchor = ask.request.text.anchor_len();
        let matched = |i: usize| matches.matched(candidates[i].id);
        let uncached = |i: usize| total.saturating_sub(matched(i)) as f64;
        let continuing = (0..candidates.len()).any(|i| matched(i) > anchor);
        let index = if continuing {
            let cost = |i: usize| uncached(i) + k.queue * candidates[i].pending as f64;
            self.ties.best(candidates.len(), |i| {
                (
                    Reverse((cost(i) * 16.0) as u64),
                    matched(i),
                    Reverse(candidates[i].load),
                )
            })
        } else {
            let held = self.footprints.of(candidates.iter().map(|c| c.id));
            let fill = |i: usize| {
                let c = &candidates[i];
                let after = (held[i] + total) as f64;
                let fill = if c.capacity > 0 {
                    after / c.capacity as f64
                } else {
                    after
                };
                fill + k.new_prefill * (uncached(i) + c.pending as f64) / c.capacity.max(1) as f64
            };
            self.ties.best(candidates.len(), |i| {
                (
                    Reverse((fill(i) * 1e6) as u64),
                    Reverse(candidates[i].pending),
                    Reverse(candidates[i].load),
                )
            })
        };
        let outcome = match matches.best() {
            0 => Outcome::PrefixMiss,
            best if matched(index) == best => Outcome::PrefixHit,
            _ => Outcome::Imbalance,
        };
        Decision {
            index,
            outcome,
            matched: matched(index),
        }
    }

    fn placed(&self, request: &Request, backend: BackendId) {
        self.footprints
            .note(request.conversation(), backend, request.text.len());
    }

    fn retain(&self, live: &dyn Fn(BackendId) -> bool) {
        self.footprints.retain(live);
    }
}
