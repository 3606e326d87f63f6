//! Choosing among equals without global state: tied candidates take turns, and random
//! picks come from a seeded generator, both owned by one policy. The same seed and the same
//! sequence of requests give the same choices, which the lab's determinism rests on.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::Candidate;

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
    pub fn best<K: Ord>(&self, len: usize, score: impl Fn(usize) -> K) -> usize {
        let Some(best) = (0..len).map(&score).max() else {
            return 0;
        };
        let mut tied = (0..len).filter(|&i| score(i) == best);
        let count = tied.clone().count().max(1);
        tied.nth(self.turn.fetch_add(1, Relaxed) % count)
            .unwrap_or(0)
    }

    /// Index of a least-loaded candidate; equally loaded ones take turns.
    pub fn least_loaded(&self, candidates: &[Candidate]) -> usize {
        self.best(candidates.len(), |i| std::cmp::Reverse(candidates[i].load))
    }

    /// A pseudo-random index in `0..n` (0 when `n` is 0): splitmix64 over a shared counter.
    pub fn below(&self, n: usize) -> usize {
        let mut x = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
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
        let picks: Vec<usize> = (0..4).map(|_| ties.best(3, |i| i != 1)).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        assert_eq!(ties.best(3, |i| i == 1), 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_picks() {
        let (a, b) = (Ties::new(7), Ties::new(7));
        let picks = |t: &Ties| (0..50).map(|_| t.below(10)).collect::<Vec<_>>();
        let first = picks(&a);
        assert_eq!(first, picks(&b));
        assert!((0..10).all(|i| first.contains(&i)), "{first:?}");
        assert_ne!(first, picks(&Ties::new(8)));
    }
}
