//! `round_robin`: candidates in turn, ignoring text and load.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request, Selector};

/// Rotates over the candidates.
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

/// The policy, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    Selector::new(RoundRobin::default()).sticky(params)
}

impl Policy for RoundRobin {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let turn = match request.explain {
            true => self.next.load(Relaxed),
            false => self.next.fetch_add(1, Relaxed),
        };
        Decision::new(turn % candidates.len(), Outcome::Balanced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    #[test]
    fn rotates() {
        let policy = RoundRobin::default();
        let t = text("x");
        let c = candidates(&[5, 0, 9]);
        let picks: Vec<usize> = (0..6)
            .map(|_| policy.choose(&request(&t, None), &c).index)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
