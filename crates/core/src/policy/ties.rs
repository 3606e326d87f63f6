//! Choosing among equals without global state: tied candidates take turns, and random
//! picks come from a seeded generator, both owned by one policy. The same seed and the same
//! sequence of requests give the same choices, which the lab's determinism rests on. An
//! explanation ([`Turn::Look`]) picks as the next decision would and moves neither.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::Candidate;

/// Whether a pick takes its turn: a decision does; an explanation
/// ([`Request::explain`](super::Request)) only looks, so that asking changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The pick is a decision: tied indexes move on.
    Take,
    /// The pick is an explanation: the same index the next decision would get.
    Look,
}

impl Turn {
    /// The turn `request`'s decision takes.
    pub fn of(request: &super::Request) -> Turn {
        if request.explain {
            Turn::Look
        } else {
            Turn::Take
        }
    }
}

/// Turn counter and random generator of one policy.
#[derive(Debug)]
pub struct Ties {
    turn: AtomicUsize,
    state: AtomicU64,
}

impl Ties {
    /// Ties whose turns and random picks start from `seed`.
    pub fn new(seed: u64) -> Self {
        Ties {
            turn: AtomicUsize::new(0),
            state: AtomicU64::new(seed),
        }
    }

    /// Index in `0..len` maximizing `score`. Tied indexes take turns (one turn per call),
    /// so that equally idle backends share new work instead of the first taking it all. A
    /// decision should call this (or [`Self::least_loaded`]) once: two calls per decision
    /// would make turns skip in step.
    pub fn best<K: Ord>(&self, turn: Turn, len: usize, score: impl Fn(usize) -> K) -> usize {
        let Some(best) = (0..len).map(&score).max() else {
            return 0;
        };
        let mut tied = (0..len).filter(|&i| score(i) == best);
        let count = tied.clone().count().max(1);
        let turn = match turn {
            Turn::Take => self.turn.fetch_add(1, Relaxed),
            Turn::Look => self.turn.load(Relaxed),
        };
        tied.nth(turn % count).unwrap_or(0)
    }

    /// Index of a least-loaded candidate; equally loaded ones take turns.
    pub fn least_loaded(&self, turn: Turn, candidates: &[Candidate]) -> usize {
        self.best(turn, candidates.len(), |i| {
            std::cmp::Reverse(candidates[i].load)
        })
    }

    /// A pseudo-random index in `0..n` (0 when `n` is 0): splitmix64 over a shared counter,
    /// which a look does not move.
    pub fn below(&self, turn: Turn, n: usize) -> usize {
        const STEP: u64 = 0x9e37_79b9_7f4a_7c15;
        let state = match turn {
            Turn::Take => self.state.fetch_add(STEP, Relaxed),
            Turn::Look => self.state.load(Relaxed),
        };
        let mut x = state.wrapping_add(STEP);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        // n fits in u64 and the remainder is below n, so both casts are lossless.
        (x % (n.max(1) as u64)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_take_turns_and_the_best_wins() {
        let ties = Ties::new(0);
        let pick = |turn| ties.best(turn, 3, |i| i != 1);
        let picks: Vec<usize> = (0..4).map(|_| pick(Turn::Take)).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        assert_eq!(pick(Turn::Look), 0, "looking shows the next turn's pick");
        assert_eq!(pick(Turn::Look), 0, "and takes no turn");
        assert_eq!(pick(Turn::Take), 0);
        assert_eq!(ties.best(Turn::Take, 3, |i| i == 1), 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_picks() {
        let (a, b) = (Ties::new(7), Ties::new(7));
        let picks = |t: &Ties| (0..50).map(|_| t.below(Turn::Take, 10)).collect::<Vec<_>>();
        let next = a.below(Turn::Look, 10);
        assert_eq!(a.below(Turn::Look, 10), next, "a look draws nothing");
        let first = picks(&a);
        assert_eq!(first[0], next);
        assert_eq!(first, picks(&b));
        assert!((0..10).all(|i| first.contains(&i)), "{first:?}");
        assert_ne!(first, picks(&Ties::new(8)));
    }
}
