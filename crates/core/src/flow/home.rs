//! Where a request the reserve is kept for goes when the backend the policy would choose
//! is not open to it: at its conversation's home it stops a lower priority or goes past
//! the ceiling ([`at_home`]), rather than move and compute its context again elsewhere
//! (a whole prefill of its context); waiting in the queue, it
//! stops a lower priority's request and the requests it outranks where it would go
//! ([`make_room`]). Decisions only: the
//! caller stops, places and waits.

use std::sync::Arc;

use super::Victims;
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
    if !cap.kept() {
        return None;
    }
    let past = cap.at_home();
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
/// slot, stops ([`Victims`]; `stop` says how many it stopped) the last placed request
/// with no answer yet of a priority below its own, on any backend; and those that share
/// the backend where the policy would place it if there were room (`unbounded`), or, for
/// a text less than half matched there, the first backend of `accounts` with any: it
/// takes a slot they free, ahead of them, rather than wait for a lower priority's request
/// to end.
pub fn make_room(
    cap: Cap,
    accounts: &[&Arc<Account>],
    size: TextBytes,
    unbounded: impl FnOnce() -> Option<(usize, Decision)>,
    mut stop: impl FnMut(Victims) -> usize,
) {
    if !cap.kept() {
        return;
    }
    stop(Victims::Below(None));
    let Some((index, decision)) = unbounded() else {
        return;
    };
    let Some(chosen) = accounts.get(index) else {
        return;
    };
    let mostly_uncached = decision.matched.0 < size.0 / 2;
    if stop(Victims::Sharing(chosen.id)) > 0 || !mostly_uncached {
        return;
    }
    for account in accounts {
        if stop(Victims::Sharing(account.id)) > 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::ledger::{self, Claim, Kept, Placing, Seat};
    use crate::policy::Published;

    /// Two backends that queued at 4 running: held at 4, then, running all 4 with none
    /// waiting, probing at 5; backend 0 running 4.
    fn fleet() -> (Vec<Arc<Account>>, Vec<Seat>) {
        let all: Vec<Arc<Account>> = (0..2)
            .map(|i| Arc::new(Account::new(BackendId(i), u64::from(i))))
            .collect();
        let published = |running, waiting| Published {
            running,
            waiting,
            kv_usage: 0.5,
        };
        for account in &all {
            account.learn_hold(published(4, 1));
            account.learn_hold(published(4, 0));
        }
        let refs: Vec<&Arc<Account>> = all.iter().take(1).collect();
        let seats = (0..4)
            .map(|_| {
                let first = |_: &[_], _| Decision::new(0, Outcome::Balanced);
                match ledger::place(&refs, 0, TextBytes(10), first) {
                    Placing::Placed { seat, .. } => seat,
                    other => panic!("not placed: {other:?}"),
                }
            })
            .collect();
        (all, seats)
    }

    fn kept() -> Cap {
        Cap::claiming(Claim::Kept(Kept::default()))
    }

    fn hit(index: usize) -> Option<(usize, Decision)> {
        Some((index, Decision::new(index, Outcome::PrefixHit)))
    }

    #[test]
    fn a_kept_request_stops_a_lower_priority_at_a_full_home_or_goes_past_its_ceiling() {
        let (all, _seats) = fleet();
        let accounts: Vec<&Arc<Account>> = all.iter().collect();
        assert!(!all[0].open(kept()) && all[0].open(kept().at_home()));
        let nobody = |_: Option<BackendId>| false;
        assert_eq!(
            at_home(kept(), &accounts, nobody, || hit(0)),
            Some(AtHome::PastCeiling(0))
        );
        let lower_at_home = |on: Option<BackendId>| on.is_none_or(|b| b == BackendId(0));
        let stop = at_home(kept(), &accounts, lower_at_home, || hit(0));
        assert_eq!(stop, Some(AtHome::Stop(0)));
        assert_eq!(stop.map(AtHome::home), Some(0));
        assert_eq!(
            at_home(kept(), &accounts, nobody, || hit(1)),
            None,
            "home open"
        );
        let placed = || Some((0, Decision::new(0, Outcome::Placed)));
        assert_eq!(at_home(kept(), &accounts, nobody, placed), None, "no home");
        let asked = Cell::new(false);
        let unbounded = || {
            asked.set(true);
            hit(0)
        };
        assert_eq!(at_home(Cap::default(), &accounts, nobody, unbounded), None);
        assert!(
            !asked.get(),
            "the policy is not asked for a request not kept"
        );
    }

    #[test]
    fn a_waiting_kept_request_stops_a_lower_priority_and_where_it_would_go_else_anywhere() {
        let (all, _seats) = fleet();
        let accounts: Vec<&Arc<Account>> = all.iter().collect();
        let tried = RefCell::new(Vec::new());
        let stop = |victims: Victims| {
            tried.borrow_mut().push(victims);
            usize::from(victims == Victims::Sharing(BackendId(0)))
        };
        let uncached = || Some((1, Decision::new(1, Outcome::Placed)));
        make_room(kept(), &accounts, TextBytes(100), uncached, stop);
        let sharing = |i| Victims::Sharing(BackendId(i));
        assert_eq!(
            *tried.borrow(),
            vec![Victims::Below(None), sharing(1), sharing(0)],
            "a lower priority, where it would go, then the first with any"
        );
        tried.borrow_mut().clear();
        let cached = || {
            let matched = TextBytes(60);
            Some((
                1,
                Decision {
                    matched,
                    ..Decision::new(1, Outcome::PrefixHit)
                },
            ))
        };
        make_room(kept(), &accounts, TextBytes(100), cached, stop);
        assert_eq!(
            *tried.borrow(),
            vec![Victims::Below(None), sharing(1)],
            "mostly cached: only there"
        );
        tried.borrow_mut().clear();
        make_room(Cap::default(), &accounts, TextBytes(100), uncached, stop);
        assert!(tried.borrow().is_empty(), "not kept: nothing stopped");
    }
}
