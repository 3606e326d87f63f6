//! The reserve: slots and KV a backend keeps for the requests flow control keeps them
//! for (a light tenant's, a higher priority's), sized by how many of those it had in
//! flight at once lately; and the prefill guard, which keeps other requests off a held
//! backend while one of those prefills there.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::units::Tokens;

/// Reads of a backend's load ([`Account::learn_hold`](super::Account::learn_hold), one a
/// second by default) over which the most requests it kept a reserve for at once is
/// remembered: a window of 5, and the window before it.
pub const KEPT_READS: usize = 5;

/// Bands of requests a reserve is kept for ([`Kept::band`](super::Kept::band)): one per
/// priority.
pub const BANDS: usize = 3;

/// A count, with the most it reached at once in this window of [`KEPT_READS`] reads and
/// the one before.
#[derive(Debug, Default)]
struct Peaked {
    now: AtomicUsize,
    peak: AtomicUsize,
    before: AtomicUsize,
}

impl Peaked {
    fn add(&self, n: usize) {
        let now = self.now.fetch_add(n, Relaxed) + n;
        self.peak.fetch_max(now, Relaxed);
    }

    fn sub(&self, n: usize) {
        self.now.fetch_sub(n, Relaxed);
    }

    fn now(&self) -> usize {
        self.now.load(Relaxed)
    }

    /// Starts a new window.
    fn turn(&self) {
        let peak = self.peak.swap(self.now(), Relaxed);
        self.before.store(peak, Relaxed);
    }

    /// The most at once lately, or now.
    fn lately(&self) -> usize {
        let peaks = (self.peak.load(Relaxed)).max(self.before.load(Relaxed));
        peaks.max(self.now())
    }
}

/// One backend's requests kept a reserve for: per band, in all with their prompt tokens
/// (each with its most at once lately), and those with no answer yet.
#[derive(Debug, Default)]
pub(super) struct Reserve {
    in_band: [AtomicUsize; BANDS],
    kept: Peaked,
    tokens: Peaked,
    prefilling: AtomicUsize,
}

impl Reserve {
    /// Requests kept a reserve for in flight in `band`.
    pub fn in_band(&self, band: usize) -> usize {
        self.in_band[band].load(Relaxed)
    }

    /// The most prompt tokens those requests had in flight at once lately.
    pub fn tokens_lately(&self) -> Tokens {
        Tokens(self.tokens.lately())
    }

    /// Whether one of them has no answer yet (the prefill guard holds).
    pub fn prefilling(&self) -> bool {
        self.prefilling.load(Relaxed) > 0
    }

    /// Starts a new window of reads.
    pub fn turn(&self) {
        self.kept.turn();
        self.tokens.turn();
    }

    /// The slots a request that leaves the reserve keeps free under `ceiling`: an eighth
    /// of it, at least one, or as many more as those requests had at once lately than
    /// now, up to half of it.
    pub fn slots(&self, ceiling: usize) -> usize {
        let wanted = self.kept.lately().saturating_sub(self.kept.now());
        (ceiling / 8).max(1).max(wanted.min(ceiling / 2))
    }

    /// Whether a request of `tokens` prompt tokens that leaves the reserve free, on a
    /// backend of `capacity` KV tokens with `all` prompt tokens in flight, leaves the KV
    /// that the requests the reserve is kept for had in flight lately, at most half the
    /// capacity; the first such request always fits. Where the engines are bound by KV
    /// rather than by sequences, a free slot is no room: the heavy flow's requests fill
    /// the KV and the engine evicts the light flow's conversations between their turns.
    pub fn leaves_kv(&self, capacity: Tokens, all: Tokens, tokens: Tokens) -> bool {
        let others = all.0.saturating_sub(self.tokens.now());
        let kept = self.tokens.lately().min(capacity.0 / 2);
        others == 0 || others.saturating_add(tokens.0).saturating_add(kept) <= capacity.0
    }

    /// One more request of `tokens` kept a reserve for, in `band`, prefilling.
    pub fn seat(&self, band: usize, tokens: Tokens) {
        self.in_band[band].fetch_add(1, Relaxed);
        self.kept.add(1);
        self.tokens.add(tokens.0);
        self.prefilling.fetch_add(1, Relaxed);
    }

    /// One of them answered.
    pub fn answered(&self) {
        self.prefilling.fetch_sub(1, Relaxed);
    }

    /// One of them, of `tokens` in `band`, finished.
    pub fn release(&self, band: usize, tokens: Tokens) {
        self.in_band[band].fetch_sub(1, Relaxed);
        self.kept.sub(1);
        self.tokens.sub(tokens.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_at_once_is_remembered_for_two_windows() {
        let count = Peaked::default();
        count.add(3);
        count.sub(2);
        assert_eq!((count.now(), count.lately()), (1, 3));
        count.turn();
        assert_eq!(count.lately(), 3, "the window before");
        count.turn();
        assert_eq!(count.lately(), 1, "gone after two");
    }

    #[test]
    fn the_reserve_is_an_eighth_of_the_ceiling_or_what_was_kept_lately_up_to_half() {
        let reserve = Reserve::default();
        assert_eq!(reserve.slots(16), 2);
        assert_eq!(reserve.slots(4), 1, "at least one");
        (0..6).for_each(|_| reserve.seat(1, Tokens(10)));
        (0..6).for_each(|_| reserve.release(1, Tokens(10)));
        assert_eq!(reserve.slots(16), 6);
        assert_eq!(reserve.slots(8), 4, "at most half");
        assert!(reserve.prefilling(), "none answered");
    }

    #[test]
    fn others_leave_the_kv_the_kept_requests_had_lately_at_most_half() {
        let reserve = Reserve::default();
        assert!(
            reserve.leaves_kv(Tokens(100), Tokens(0), Tokens(1_000)),
            "the first always fits"
        );
        reserve.seat(0, Tokens(40));
        assert!(
            reserve.leaves_kv(Tokens(100), Tokens(50), Tokens(50)),
            "10 + 50 + 40"
        );
        assert!(!reserve.leaves_kv(Tokens(100), Tokens(50), Tokens(51)));
        reserve.release(0, Tokens(40));
        reserve.seat(0, Tokens(80));
        assert!(
            reserve.leaves_kv(Tokens(100), Tokens(90), Tokens(40)),
            "10 + 40 + half of 100"
        );
    }
}
