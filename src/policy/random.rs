//! `random`: a uniformly random candidate.

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request};

/// Picks at random.
pub struct Random;

pub fn build(_: &PolicyParams) -> Box<dyn Policy> {
    Box::new(Random)
}

impl Policy for Random {
    fn choose(&self, _: &Request, candidates: &[Candidate]) -> Decision {
        Decision::new(fastrand::usize(..candidates.len()), Outcome::Balanced)
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
        for _ in 0..200 {
            seen[Random.choose(&request(&t, None), &c).index] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
