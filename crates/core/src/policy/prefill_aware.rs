//! `prefill_aware`: the backend that can start this request's first token soonest. Its cost
//! on a backend is the prefill work already queued there (uncached text of requests that
//! have not answered yet) plus this request's text that the backend does not hold. A long
//! match wins while its backend keeps up; a hot shared prompt spreads as soon as its first
//! backend's queue costs more than recomputing the prompt elsewhere, with no thresholds.

use std::cmp::Reverse;

use super::prefix::{Ask, PrefixPolicy, Rule};
use super::{Decision, Outcome, PolicyParams, Selector, Ties, Turn};
use crate::units::TextBytes;

/// The least-estimated-prefill rule.
pub struct LeastPrefill {
    ties: Ties,
}

/// The policy over a prefix index of its own, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    let rule = LeastPrefill {
        ties: Ties::new(params.seed),
    };
    let index = params.index();
    Selector::new(PrefixPolicy::new(&index, rule))
        .indexed(index)
        .sticky(params)
}

impl Rule for LeastPrefill {
    fn decide(&self, ask: &Ask) -> Decision {
        let (matches, candidates) = (ask.matches, ask.candidates);
        let matched = |i: usize| ask.matched(i);
        let cost = |i: usize| candidates[i].pending + matches.total().saturating_sub(matched(i));
        let index = self
            .ties
            .best(Turn::of(ask.request), candidates.len(), |i| {
                (Reverse(cost(i)), matched(i), Reverse(candidates[i].load))
            });
        let best = (0..candidates.len()).map(matched).max().unwrap_or_default();
        let outcome = match best {
            TextBytes(0) => Outcome::PrefixMiss,
            best if matched(index) == best => Outcome::PrefixHit,
            _ => Outcome::Imbalance,
        };
        Decision {
            index,
            outcome,
            matched: matched(index),
            home: (outcome == Outcome::PrefixHit).then_some(index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Candidate;
    use crate::policy::testing::*;

    fn policy() -> Selector {
        build(&params(0.3, 64))
    }

    fn with_pending(pending: &[usize]) -> Vec<Candidate> {
        let mut c = candidates(&vec![0; pending.len()]);
        c.iter_mut()
            .zip(pending)
            .for_each(|(c, &p)| c.pending = TextBytes(p));
        c
    }

    #[test]
    fn follows_the_match_while_its_backend_keeps_up() {
        let p = policy();
        let prompt = "a shared system prompt that is long enough to matter. ".repeat(20);
        let first = text(Box::leak(prompt.clone().into_boxed_str()));
        let d1 = p.select(&request(&first, None), &with_pending(&[0, 0, 0]));
        let next = text(Box::leak(
            format!("{prompt} and a new question").into_boxed_str(),
        ));
        let d2 = p.select(&request(&next, None), &with_pending(&[0, 0, 0]));
        assert_eq!((d2.index, d2.outcome), (d1.index, Outcome::PrefixHit));
        // Its queue now costs more than recomputing the whole text elsewhere.
        let mut busy = vec![0, 0, 0];
        busy[d1.index] = 10 * next.len();
        let d3 = p.select(&request(&next, None), &with_pending(&busy));
        assert_ne!(d3.index, d1.index);
        assert_eq!(d3.outcome, Outcome::Imbalance);
    }

    #[test]
    fn new_texts_go_to_the_least_queued() {
        let p = policy();
        let t = text("never seen before");
        let d = p.select(&request(&t, None), &with_pending(&[500, 20, 900]));
        assert_eq!((d.index, d.outcome), (1, Outcome::PrefixMiss));
        assert_eq!(d.matched, TextBytes(0));
    }
}
