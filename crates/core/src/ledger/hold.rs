//! The hold: requests in flight a backend takes before more wait in the router, learnt
//! from the queue it publishes, so that work waits where priority and fairness act
//! rather than in the engine's own queue.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::Account;
use crate::policy::Published;

/// One backend's hold, the ceiling it fell to when the engine last queued, and the hold
/// the requests in flight were placed under; each 0 until learnt.
#[derive(Debug, Default)]
pub(super) struct Hold {
    hold: AtomicUsize,
    /// What it ran when it last queued (0: never): the hold before it grew, which a
    /// reserve is kept under.
    ceiling: AtomicUsize,
    /// The hold before the last read.
    placed_under: AtomicUsize,
}

impl Hold {
    /// Learns from what the backend just published: while requests wait in the engine's
    /// own queue, the hold is what it runs; while it runs all the hold lets through and
    /// none wait, the hold grows by a quarter, so that a backend with room is never held
    /// to an old measure (a hold the router does not fill, as when it keeps a reserve,
    /// stays). No hold until the engine first queued.
    pub fn learn(&self, published: Published) {
        let hold = self.hold.load(Relaxed);
        self.placed_under.store(hold, Relaxed);
        let next = if published.waiting > 0 {
            self.ceiling.store(published.running.max(1), Relaxed);
            published.running.max(1)
        } else if hold > 0 && published.running >= hold {
            hold + (hold / 4).max(1)
        } else {
            hold
        };
        self.hold.store(next, Relaxed);
    }

    /// Takes `peers`' hold and ceiling while it learnt none of its own.
    pub fn adopt(&self, (hold, ceiling): (usize, usize)) {
        if self.hold.load(Relaxed) == 0 && hold > 0 {
            self.hold.store(hold, Relaxed);
            self.ceiling.store(ceiling.max(1), Relaxed);
        }
    }

    pub fn forget(&self) {
        self.hold.store(0, Relaxed);
        self.placed_under.store(0, Relaxed);
        self.ceiling.store(0, Relaxed);
    }

    /// The hold and the ceiling (0: none).
    pub fn held(&self) -> (usize, usize) {
        (self.hold.load(Relaxed), self.ceiling.load(Relaxed))
    }

    /// Of `load` requests in flight, those past the hold that the engine queues: what it
    /// published as waiting, at most the load over the hold and over the hold before the
    /// last read. 0 without a hold.
    pub fn excess(&self, load: usize, published: Published) -> usize {
        let hold = self.hold.load(Relaxed);
        if hold == 0 {
            return 0;
        }
        let placed_under = self.placed_under.load(Relaxed);
        load.saturating_sub(hold.max(placed_under))
            .min(published.waiting)
    }
}

/// Each of `accounts` that published its load but never queued takes the largest hold and
/// ceiling the others learnt ([`Account::adopt_hold`]), after a read of them all.
pub fn share_holds<'a>(accounts: impl Iterator<Item = &'a Account> + Clone) {
    let held = accounts.clone().map(Account::held);
    let peers = held.fold((0, 0), |(h, c), (hold, ceiling)| {
        (h.max(hold), c.max(ceiling))
    });
    let published = accounts.filter(|a| a.published().is_some());
    published.for_each(|a| a.adopt_hold(peers));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(running: usize, waiting: usize) -> Published {
        Published {
            running,
            waiting,
            kv_usage: 0.5,
        }
    }

    #[test]
    fn only_the_queue_past_the_hold_and_the_hold_before_counts_as_excess() {
        let hold = Hold::default();
        assert_eq!(hold.excess(9, load(4, 5)), 0, "no hold");
        hold.learn(load(4, 5));
        assert_eq!(hold.held(), (4, 4));
        assert_eq!(hold.excess(9, load(4, 5)), 5);
        assert_eq!(
            hold.excess(6, load(4, 5)),
            2,
            "at most the load over the hold"
        );
        hold.learn(load(2, 1));
        assert_eq!(hold.excess(6, load(2, 1)), 1, "at most what waits");
        assert_eq!(hold.excess(4, load(2, 3)), 0, "not past the hold before");
    }
}
