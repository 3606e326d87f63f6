//! Where a request the reserve is kept for goes when the backend the policy would choose
//! is not open to it: at its conversation's home it stops a lower priority or goes past
//! the ceiling ([`at_home`]), rather than move and compute its context again elsewhere
//! (200-700 ms for 20-50K tokens in `benches/tenants/noisy.sh`); waiting in the queue, it
//! stops the requests it outranks where it would go ([`make_room`]). Decisions only: the
//! caller stops, places and waits.

use std::sync::Arc;

use crate::BackendId;
use crate::ledger::{Account, Cap};
use crate::policy::{Decision, Outcome};
use crate::units::TextBytes;

/// How a request the reserve is kept for stays at its conversation's home when the home
/// is not open to it; each names the home's position among the accounts asked of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtHome {
    /// It stops there the last placed request with no answer yet of a priority below its
    /// own, and takes the slot that frees at once, one past the home's limit until the
    /// stopped request lets it go (`Cap::over`, so that, placed again, it does not take
    /// it back).
    Stop(usize),
    /// With none to stop, the home at its ceiling but below its hold: it goes past the
    /// ceiling and waits in the engine's queue there (`Cap::home`).
    PastCeiling(usize),
}

impl AtHome {
    /// The home's position among the accounts asked of.
    pub fn home(self) -> usize {
        match self {
            AtHome::Stop(i) | AtHome::PastCeiling(i) => i,
        }
    }
}

/// How a request under `cap` stays home among `accounts`, if the reserve is kept for it
/// and its conversation's home is not open to it. `outranks` says whether a request of a
/// lower priority with no answer yet is in flight on a backend (`None`: any); `unbounded`
/// is where the policy would place it if every backend had room (asked only while
/// `outranks(None)` or a backend is at its ceiling).
pub fn at_home(
    cap: Cap,
    accounts: &[&Arc<Account>],
    outranks: impl Fn(Option<BackendId>) -> bool,
    unbounded: impl FnOnce() -> Option<(usize, Decision)>,
) -> Option<AtHome> {
    if !cap.kept {
        return None;
    }
    let past = Cap { home: true, ..cap };
    let at_ceiling = || accounts.iter().any(|a| !a.open(cap) && a.open(past));
    if !outranks(None) && !at_ceiling() {
        return None;
    }
    let (index, decision) = unbounded()?;
    let home = accounts.get(index)?;
    if decision.outcome != Outcome::PrefixHit || home.open(cap) {
        return None;
    }
    if outranks(Some(home.id)) {
        Some(AtHome::Stop(index))
    } else {
        home.open(past).then_some(AtHome::PastCeiling(index))
    }
}

/// A request under `cap` the reserve is kept for, of routing text `size`, waiting for a
/// slot, stops the requests it outranks that have no answer yet where the policy would
/// place it if there were room (`unbounded`), or, for a text less than half matched
/// there, on the first backend of `accounts` with such requests (`preempt` stops them on
/// a backend and says how many): it takes a slot they free, ahead of them.
pub fn make_room(
    cap: Cap,
    accounts: &[&Arc<Account>],
    size: TextBytes,
    unbounded: impl FnOnce() -> Option<(usize, Decision)>,
    mut preempt: impl FnMut(BackendId) -> usize,
) {
    if !cap.kept {
        return;
    }
    let Some((index, decision)) = unbounded() else {
        return;
    };
    let Some(chosen) = accounts.get(index) else {
        return;
    };
    let mostly_uncached = decision.matched.0 < size.0 / 2;
    if preempt(chosen.id) > 0 || !mostly_uncached {
        return;
    }
    for account in accounts {
        if preempt(account.id) > 0 {
            return;
        }
    }
}
