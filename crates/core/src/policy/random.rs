//! `random`: a uniformly random candidate.

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request, Selector, Ties, Turn};

/// Picks at random.
pub struct Random {
    dice: Ties,
}

/// The policy, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    Selector::new(Random {
        dice: Ties::new(params.seed),
    })
    .sticky(params)
}

impl Policy for Random {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let index = self.dice.below(Turn::of(request), candidates.len());
        Decision::new(index, Outcome::Balanced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    #[test]
    fn reaches_every_candidate() {
        let t = text("x");
        let c = candidates(&[0, 0, 0]);
        let mut seen = [false; 3];
        let p = build(&params(0.3, 64));
        for _ in 0..200 {
            seen[p.select(&request(&t, None), &c).index] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
