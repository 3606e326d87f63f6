//! `cache_aware`, with the peers' semantics (SGLang / vllm-project router) so results can be
//! compared: when the fleet is imbalanced take the least loaded backend; else follow the
//! best prefix match if it covers at least `cache_threshold` of the text (ties: least
//! loaded); else the least loaded. The text is then recorded under the chosen backend.

use super::prefix::{Ask, PrefixPolicy, Rule};
use super::{Decision, Outcome, PolicyParams, Selector, SharedTunables, Ties, Turn, imbalanced};

/// The peers' threshold rule.
pub struct Threshold {
    tunables: SharedTunables,
    ties: Ties,
}

/// The policy over a prefix index of its own, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    let rule = Threshold {
        tunables: params.tunables.clone(),
        ties: Ties::new(params.seed),
    };
    let index = params.index();
    Selector::new(PrefixPolicy::new(&index, rule))
        .indexed(index)
        .sticky(params)
}

impl Rule for Threshold {
    fn decide(&self, ask: &Ask) -> Decision {
        let (matches, candidates) = (ask.matches, ask.candidates);
        let matched = |i: usize| ask.matched(i);
        let tunables = self.tunables.get();
        if imbalanced(candidates, &tunables.balance) {
            let index = self.ties.least_loaded(Turn::of(ask.request), candidates);
            return Decision {
                index,
                outcome: Outcome::Imbalance,
                matched: matched(index),
                home: None,
            };
        }
        let best = (0..candidates.len()).map(matched).max().unwrap_or_default();
        let ratio = best.0 as f64 / matches.total().0.max(1) as f64;
        if best.0 > 0 && ratio >= tunables.cache_threshold {
            let index = self
                .ties
                .best(Turn::of(ask.request), candidates.len(), |i| {
                    (matched(i), std::cmp::Reverse(candidates[i].load))
                });
            return Decision {
                index,
                outcome: Outcome::PrefixHit,
                matched: matched(index),
                home: Some(index),
            };
        }
        let index = self.ties.least_loaded(Turn::of(ask.request), candidates);
        Decision {
            index,
            outcome: Outcome::PrefixMiss,
            matched: matched(index),
            home: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    fn policy(threshold: f64) -> Selector {
        build(&params(threshold, 4))
    }

    #[test]
    fn follows_the_prefix_and_records_it() {
        let p = policy(0.3);
        let first = text("a long shared conversation prefix");
        let d1 = p.select(&request(&first, None), &candidates(&[0, 0, 0]));
        assert_eq!(d1.outcome, Outcome::PrefixMiss);
        let next = text("a long shared conversation prefix, and a new turn");
        let d2 = p.select(&request(&next, None), &candidates(&[1, 0, 0]));
        assert_eq!((d2.index, d2.outcome), (d1.index, Outcome::PrefixHit));
        assert_eq!(d2.matched, first.size());
    }

    #[test]
    fn below_threshold_takes_least_loaded() {
        let p = policy(0.9);
        let first = text("abcdefgh");
        let d1 = p.select(&request(&first, None), &candidates(&[0, 0]));
        let other = text("abcdefgh and much more text that was never seen");
        let mut loads = [0, 0];
        loads[d1.index] = 1;
        let d2 = p.select(&request(&other, None), &candidates(&loads));
        assert_eq!((d2.index, d2.outcome), (1 - d1.index, Outcome::PrefixMiss));
    }

    #[test]
    fn imbalance_overrides_the_match() {
        let p = policy(0.3);
        let t = text("conversation");
        let d1 = p.select(&request(&t, None), &candidates(&[0, 0]));
        let mut loads = [0, 0];
        loads[d1.index] = 10;
        let d2 = p.select(&request(&t, None), &candidates(&loads));
        assert_eq!((d2.index, d2.outcome), (1 - d1.index, Outcome::Imbalance));
    }

    #[test]
    fn idle_ties_spread_over_backends() {
        let p = policy(0.3);
        let texts = ["q1", "w2", "e3", "r4", "t5", "y6", "u7", "i8", "o9", "p0"];
        let mut seen = [0; 3];
        for s in texts {
            let t = text(s);
            seen[p.select(&request(&t, None), &candidates(&[0, 0, 0])).index] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }

    #[test]
    fn a_session_reports_what_its_backend_already_had() {
        let p = policy(0.3);
        let first = text("shared prefix");
        let d = p.select(&request(&first, Some("s")), &candidates(&[0, 0]));
        let longer = text("shared prefix and more");
        let again = p.select(&request(&longer, Some("s")), &candidates(&[0, 0]));
        assert_eq!((again.index, again.outcome), (d.index, Outcome::Session));
        assert_eq!(again.matched, first.size());
    }
}
