//! `least_load`: the candidate with the fewest requests in flight (ties at random).

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request, Selector, Ties, Turn};

/// Picks the least loaded.
pub struct LeastLoad {
    ties: Ties,
}

/// The policy, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    Selector::new(LeastLoad {
        ties: Ties::new(params.seed),
    })
    .sticky(params)
}

impl Policy for LeastLoad {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let index = self.ties.least_loaded(Turn::of(request), candidates);
        Decision::new(index, Outcome::Balanced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    #[test]
    fn picks_least_loaded_and_spreads_ties() {
        let t = text("x");
        let p = build(&params(0.3, 64));
        assert_eq!(
            p.select(&request(&t, None), &candidates(&[3, 1, 2])).index,
            1
        );
        let tied = candidates(&[0, 0, 5]);
        let mut seen = [0; 3];
        for _ in 0..200 {
            seen[p.select(&request(&t, None), &tied).index] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] == 0, "{seen:?}");
    }
}
