//! The upkeep schedule of the selector's index and tables ([`UpkeepSchedule`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::Account;
use crate::policy::Selector;
use crate::units::KeyBytes;

/// Time between two full upkeeps of the index and the tables, by default
/// (`eviction_interval`).
pub const EVICTION_INTERVAL: Duration = Duration::from_secs(120);

/// What upkeep is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Nothing,
    /// Evict the index down to its budgets.
    Trim,
    /// Sweep the tables, forget removed backends, evict.
    Full,
}

/// When upkeep last ran in full.
struct Schedule {
    interval: Duration,
    last: Duration,
    generation: u64,
}

impl Schedule {
    fn due(&mut self, now: Duration, generation: u64, grown: bool) -> Work {
        if now.saturating_sub(self.last) >= self.interval || generation != self.generation {
            (self.last, self.generation) = (now, generation);
            Work::Full
        } else if grown {
            Work::Trim
        } else {
            Work::Nothing
        }
    }
}

/// The upkeep of the selector's index and tables, on its schedule; shared by every
/// request.
pub struct UpkeepSchedule {
    schedule: Mutex<Schedule>,
}

impl UpkeepSchedule {
    /// UpkeepSchedule that runs in full every `eviction_interval`, and whenever the set of backends
    /// changes.
    pub fn new(eviction_interval: Duration) -> Self {
        UpkeepSchedule {
            schedule: Mutex::new(Schedule {
                interval: eviction_interval,
                last: Duration::ZERO,
                generation: 0,
            }),
        }
    }

    /// UpkeepSchedule at `now` of `selector`'s index and tables over the backends of `accounts`
    /// (their set's `generation`): index budgets sized from newly published capacities;
    /// then a full sweep every interval or when the set changed, else eviction alone when
    /// a decision found it due. Returns the key bytes evicted.
    pub fn run(
        &self,
        now: Duration,
        generation: u64,
        selector: &Selector,
        accounts: &[&Arc<Account>],
    ) -> KeyBytes {
        for account in accounts {
            let change = account.publication.budget_change();
            if let (Some(capacity), Some(index)) = (change, selector.index()) {
                index.set_capacity(account.id, capacity);
            }
        }
        let grown = selector.take_upkeep_due();
        match self.schedule.lock().due(now, generation, grown) {
            Work::Full => selector.maintain(&|id| accounts.iter().any(|a| a.id == id)),
            Work::Trim => selector.trim(),
            Work::Nothing => KeyBytes(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upkeep_runs_in_full_on_its_interval_or_a_new_fleet_and_trims_when_grown() {
        let mut s = Schedule {
            interval: Duration::from_secs(10),
            last: Duration::ZERO,
            generation: 0,
        };
        let at = Duration::from_secs;
        assert_eq!(s.due(at(1), 0, false), Work::Nothing);
        assert_eq!(s.due(at(2), 0, true), Work::Trim);
        assert_eq!(s.due(at(3), 1, false), Work::Full);
        assert_eq!(s.due(at(12), 1, false), Work::Nothing);
        assert_eq!(s.due(at(13), 1, false), Work::Full);
    }
}
