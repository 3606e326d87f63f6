//! Taking back what an engine queues past its hold. Until a backend's hold is learned
//! (its first published queue, a read after a start), the router may have placed more
//! requests there than the engine runs: the rest wait in the engine's own
//! first-come-first-served queue, where no priority or fair share acts, and each slot
//! that frees there goes to the next of them rather than to a higher priority or a light
//! tenant waiting in the router. After each read of the backends' load, the last placed
//! of those requests with no answer yet are stopped, as many as the engine said it queues
//! past the hold ([`Account::excess`]: not the quarter a hold probes past the engine,
//! nor what a hold that fell leaves) and the router's queue has room for, and wait in
//! the router's queue instead; their clients see only the delay, and each may still be
//! stopped once for a request that outranks it ([`super::Stopped::TakenBack`]). Only
//! requests that may be stopped at all (not one the reserve is kept for, nor one
//! stopped for another).
//!
//! Only with standing slots (`standing_slots`), which it frees: at a start, a flood's
//! first requests can queue deep in one or two engines, whose standing slots would then
//! go to them. Without standing slots there is no slot kept free for the requests taken
//! back to be placed ahead of, and the stops only cost the flood its prefill.

use super::share::Shares;
use crate::ledger::{self, Account};

/// After a read of every one of `accounts`' published load, with a tenants file, the same
/// in every front end: those that never queued take their peers' hold
/// ([`ledger::share_holds`]), the backends kept for light flows are chosen
/// ([`ledger::protect_kv`]), and with `standing` slots what the engines queue past their
/// holds is taken back, `room` at most ([`take_back`]); how many were.
pub fn after_read(shares: &Shares, accounts: &[&Account], room: usize, standing: usize) -> usize {
    ledger::share_holds(accounts.iter().copied());
    ledger::protect_kv(accounts.iter().copied());
    take_back(shares, accounts.iter().copied(), room, standing)
}

/// With `standing` slots (the tenants file's `standing_slots`), stops, on each of
/// `accounts`, the last placed requests with no answer yet that its engine queues past
/// its hold ([`Account::excess`]), `room` at most in all (the router's queue's); how many.
pub fn take_back<'a>(
    shares: &Shares,
    accounts: impl IntoIterator<Item = &'a Account>,
    room: usize,
    standing: usize,
) -> usize {
    if standing == 0 {
        return 0;
    }
    let mut taken = 0;
    for account in accounts {
        let excess = account.excess().min(room - taken);
        if excess > 0 {
            taken += shares.preemptions.take_back(account.id, excess);
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use super::*;
    use crate::BackendId;
    use crate::flow::{Priority, Stopped, TenantId};
    use crate::ledger::{self, Placing};
    use crate::policy::{Decision, Outcome, Published};
    use crate::units::TextBytes;

    #[test]
    fn requests_an_engine_queues_past_its_hold_are_taken_back_within_the_room() {
        let shares = Shares::default();
        let all: Vec<Arc<Account>> = (0..2)
            .map(|i| Arc::new(Account::new(BackendId(i), u64::from(i))))
            .collect();
        let stopped = Arc::new(AtomicUsize::new(0));
        let mut seats = Vec::new();
        let mut guards = Vec::new();
        for (backend, n) in [(0, 7), (1, 3)] {
            let on: Vec<&Arc<Account>> = vec![&all[backend]];
            for _ in 0..n {
                let first = |_: &[_], _| Decision::new(0, Outcome::Balanced);
                let Placing::Placed { seat, .. } = ledger::place(&on, 0, TextBytes(10), first)
                else {
                    panic!("not placed");
                };
                seats.push(seat);
                let count = Arc::clone(&stopped);
                let stop = Box::new(move |why| {
                    assert_eq!(why, Stopped::TakenBack);
                    count.fetch_add(1, Relaxed);
                });
                guards.push(shares.preemptions.enter(
                    all[backend].id,
                    &TenantId::new("a"),
                    Priority::Low,
                    stop,
                ));
            }
        }
        let accounts = || all.iter().map(|a| &**a);
        assert_eq!(
            take_back(&shares, accounts(), 8, 1),
            0,
            "no hold learned yet"
        );
        let published = |running, waiting| Published {
            running,
            waiting,
            kv_usage: 0.5,
        };
        all[0].set_published(Some(published(4, 3)));
        all[0].learn_hold(published(4, 3));
        all[1].set_published(Some(published(3, 0)));
        all[1].learn_hold(published(3, 0));
        assert_eq!(all[0].excess(), 3, "7 placed, 4 held, 3 queued");
        assert_eq!(all[1].excess(), 0, "no hold: it never queued");
        assert_eq!(take_back(&shares, accounts(), 8, 0), 0, "no standing slots");
        assert_eq!(
            take_back(&shares, accounts(), 2, 1),
            2,
            "as many as the room"
        );
        assert_eq!(stopped.load(Relaxed), 2);
        // The two stopped, the last placed on backend 0, leave it.
        seats.drain(5..7);
        guards.drain(5..7);
        assert_eq!(all[0].load(), 5);
        assert_eq!(take_back(&shares, accounts(), 8, 1), 1, "the third");
        assert_eq!(stopped.load(Relaxed), 3);
    }

    #[test]
    fn what_a_hold_probes_or_leaves_as_it_falls_is_not_excess() {
        let account = Account::new(BackendId(0), 0);
        let published = |running, waiting| Published {
            running,
            waiting,
            kv_usage: 0.5,
        };
        let read = |p: Published| {
            account.set_published(Some(p));
            account.learn_hold(p);
        };
        read(published(4, 1));
        read(published(4, 0));
        assert_eq!(account.held(), (5, 4), "probing a quarter past the engine");
        let on = [&Arc::new(account)];
        let seats: Vec<_> = (0..5)
            .map(|_| {
                let first = |_: &[_], _| Decision::new(0, Outcome::Balanced);
                match ledger::place(&on, 0, TextBytes(10), first) {
                    Placing::Placed { seat, .. } => seat,
                    other => panic!("not placed: {other:?}"),
                }
            })
            .collect();
        let account = on[0];
        account.set_published(Some(published(4, 1)));
        account.learn_hold(published(4, 1));
        assert_eq!(account.held(), (4, 4));
        assert_eq!(account.excess(), 0, "placed under a hold of 5");
        drop(seats);
    }
}
