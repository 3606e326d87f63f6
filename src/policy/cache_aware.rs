//! `cache_aware`, with the peers' semantics (SGLang / vllm-project router) so results can be
//! compared: when the fleet is imbalanced take the least loaded backend; else follow the
//! best prefix match if it covers at least `cache_threshold` of the text (ties: least
//! loaded); else the least loaded. The text is then recorded under the chosen backend.

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request};
use super::{imbalanced, least_loaded, pick_best};
use crate::BackendId;
use crate::config::Balance;
use crate::tree::{Matches, PrefixTrees, TreeStats};

/// Prefix-affine routing bounded by load.
pub struct CacheAware {
    trees: PrefixTrees,
    threshold: f64,
    balance: Balance,
}

pub fn build(params: &PolicyParams) -> Box<dyn Policy> {
    Box::new(CacheAware {
        trees: PrefixTrees::new(params.tree.clone()),
        threshold: params.cache_threshold,
        balance: params.balance,
    })
}

impl CacheAware {
    fn by_match(&self, matches: &Matches, candidates: &[Candidate]) -> Decision {
        let matched = |i: usize| matches.matched(candidates[i].id);
        let best = pick_best(candidates.len(), |i| (matched(i), std::cmp::Reverse(candidates[i].load)));
        let ratio = matched(best) as f64 / matches.total().max(1) as f64;
        if matched(best) > 0 && ratio >= self.threshold {
            return Decision { index: best, outcome: Outcome::PrefixHit, matched: matched(best) };
        }
        let index = least_loaded(candidates);
        Decision { index, outcome: Outcome::PrefixMiss, matched: matched(index) }
    }
}

impl Policy for CacheAware {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let parts = request.text.parts();
        if imbalanced(candidates, &self.balance) {
            let index = least_loaded(candidates);
            self.trees.insert(request.model, parts, candidates[index].id);
            return Decision::new(index, Outcome::Imbalance);
        }
        let mut decision = Decision::new(0, Outcome::PrefixMiss);
        self.trees.route(request.model, parts, |matches| {
            decision = self.by_match(matches, candidates);
            Some(candidates[decision.index].id)
        });
        decision
    }

    fn record(&self, request: &Request, backend: BackendId) {
        self.trees.insert(request.model, request.text.parts(), backend);
    }

    fn maintain(&self, live: &dyn Fn(BackendId) -> bool) {
        self.trees.retain_backends(live);
        self.trees.evict();
    }

    fn needs_upkeep(&self) -> bool {
        self.trees.over_budget()
    }

    fn tree_stats(&self) -> Option<TreeStats> {
        Some(self.trees.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;
    use crate::tree::TreeConfig;

    fn policy(threshold: f64) -> CacheAware {
        CacheAware {
            trees: PrefixTrees::new(TreeConfig::default()),
            threshold,
            balance: Balance { abs: 4, rel: 1.5 },
        }
    }

    #[test]
    fn follows_the_prefix_and_records_it() {
        let p = policy(0.3);
        let first = text("a long shared conversation prefix");
        let d1 = p.choose(&request(&first, None), &candidates(&[0, 0, 0]));
        assert_eq!(d1.outcome, Outcome::PrefixMiss);
        let next = text("a long shared conversation prefix, and a new turn");
        let d2 = p.choose(&request(&next, None), &candidates(&[1, 0, 0]));
        assert_eq!((d2.index, d2.outcome), (d1.index, Outcome::PrefixHit));
        assert_eq!(d2.matched, first.len());
    }

    #[test]
    fn below_threshold_takes_least_loaded() {
        let p = policy(0.9);
        let first = text("abcdefgh");
        let d1 = p.choose(&request(&first, None), &candidates(&[0, 0]));
        let other = text("abcdefgh and much more text that was never seen");
        let mut loads = [0, 0];
        loads[d1.index] = 1;
        let d2 = p.choose(&request(&other, None), &candidates(&loads));
        assert_eq!((d2.index, d2.outcome), (1 - d1.index, Outcome::PrefixMiss));
    }

    #[test]
    fn imbalance_overrides_the_match() {
        let p = policy(0.3);
        let t = text("conversation");
        let d1 = p.choose(&request(&t, None), &candidates(&[0, 0]));
        let mut loads = [0, 0];
        loads[d1.index] = 10;
        let d2 = p.choose(&request(&t, None), &candidates(&loads));
        assert_eq!((d2.index, d2.outcome), (1 - d1.index, Outcome::Imbalance));
    }

    #[test]
    fn idle_ties_spread_over_backends() {
        let p = policy(0.3);
        let texts = ["q1", "w2", "e3", "r4", "t5", "y6", "u7", "i8", "o9", "p0"];
        let mut seen = [0; 3];
        for s in texts.iter().cycle().take(30) {
            let t = text(s);
            seen[p.choose(&request(&t, None), &candidates(&[0, 0, 0])).index] += 1;
        }
        assert!(seen.iter().filter(|&&n| n > 0).count() >= 2, "{seen:?}");
    }
}
