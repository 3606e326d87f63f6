//! The retry budget, as Envoy's: retries in progress stay below a share of the requests
//! being served (at least a few are always allowed), so that in an outage, when every
//! attempt fails, retries cannot multiply the load on the backends left.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::limits::RetrySettings;

/// Retries in progress.
#[derive(Debug, Default)]
pub struct RetryBudget {
    retrying: AtomicUsize,
}

/// One retry in progress; dropping it ends it.
#[derive(Debug)]
pub struct Retrying<'b>(&'b RetryBudget);

impl Drop for Retrying<'_> {
    fn drop(&mut self) {
        self.0.retrying.fetch_sub(1, Relaxed);
    }
}

impl RetryBudget {
    /// A retry, if the budget allows one more while `active` requests are being served.
    pub fn take(&self, settings: &RetrySettings, active: usize) -> Option<Retrying<'_>> {
        let allowed = (active * settings.budget_percent / 100).max(settings.min_concurrency);
        let taken =
            (self.retrying).fetch_update(Relaxed, Relaxed, |n| (n < allowed).then_some(n + 1));
        taken.ok().map(|_| Retrying(self))
    }

    /// Retries in progress now.
    pub fn in_progress(&self) -> usize {
        self.retrying.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_a_share_of_the_requests_served() {
        let budget = RetryBudget::default();
        let settings = RetrySettings::default();
        let held: Vec<_> = (0..100).map_while(|_| budget.take(&settings, 50)).collect();
        assert_eq!(held.len(), 10, "20% of 50");
        drop(held);
        assert_eq!(budget.in_progress(), 0);
        let few: Vec<_> = (0..10).map_while(|_| budget.take(&settings, 1)).collect();
        assert_eq!(few.len(), 3, "the minimum");
    }
}
