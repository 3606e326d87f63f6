//! `power_of_two`: two random candidates, the less loaded of them.

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request, Selector, Ties, Turn};

/// Power of two choices.
pub struct PowerOfTwo {
    dice: Ties,
}

/// The policy, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    Selector::new(PowerOfTwo {
        dice: Ties::new(params.seed),
    })
    .sticky(params)
}

impl Policy for PowerOfTwo {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let (n, turn) = (candidates.len(), Turn::of(request));
        let a = self.dice.below(turn, n);
        // A second candidate distinct from the first when there is one.
        let b = (a + 1 + self.dice.below(turn, n.max(2) - 1)) % n;
        let index = if candidates[b].load < candidates[a].load {
            b
        } else {
            a
        };
        Decision::new(index, Outcome::Balanced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    #[test]
    fn never_picks_the_most_loaded_of_two() {
        let t = text("x");
        let c = candidates(&[0, 100]);
        let p = build(&params(0.3, 64));
        for _ in 0..50 {
            assert_eq!(p.select(&request(&t, None), &c).index, 0);
        }
        assert_eq!(p.select(&request(&t, None), &candidates(&[4])).index, 0);
    }
}
