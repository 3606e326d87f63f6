//! The ledger's placement rules, through its accounts.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::BackendId;
use crate::policy::{Asking, Candidate, Decision, Outcome, Published};
use crate::units::{PromptSize, TextBytes, Tokens};

fn accounts(n: u32) -> Vec<Arc<Account>> {
    (0..n)
        .map(|i| Arc::new(Account::new(BackendId(i), u64::from(i))))
        .collect()
}

/// What a backend published: `running` and `waiting` requests, half its KV used.
fn load(running: usize, waiting: usize) -> Published {
    Published {
        running,
        waiting,
        kv_usage: 0.5,
    }
}

fn first(_: &[Candidate], _: Asking) -> Decision {
    Decision {
        index: 0,
        outcome: Outcome::Balanced,
        matched: TextBytes(30),
        home: None,
    }
}

#[test]
fn a_backend_that_queues_is_held_near_what_it_runs_and_released_as_it_drains() {
    let all = accounts(1);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    all[0].learn_hold(load(8, 0));
    assert_eq!(all[0].hold(), None, "no hold before it ever queued");
    all[0].learn_hold(load(8, 5));
    assert_eq!(all[0].hold(), Some(8), "what it runs");
    let seats: Vec<_> = (0..12)
        .filter_map(|_| match place(&refs, 0, TextBytes(1), first) {
            Placing::Placed { seat, .. } => Some(seat),
            _ => None,
        })
        .collect();
    assert_eq!(seats.len(), 8);
    assert!(!open(&refs, 0));
    all[0].learn_hold(load(8, 0));
    assert_eq!(all[0].hold(), Some(10), "no queue: the hold grows");
    assert!(open(&refs, 0));
    let kept = |home| {
        Cap::claiming(Claim::Kept(Kept {
            home,
            ..Kept::default()
        }))
    };
    let reserve = Cap::claiming(Claim::Leaves);
    for (cap, opens, why) in [
        (reserve, false, "one of the 8 it ran kept for others"),
        (kept(false), false, "a kept request: no further than it ran"),
        (kept(true), true, "unless it stays home"),
    ] {
        assert_eq!(open(&refs, cap), opens, "{why}");
    }
    all[0].learn_hold(load(9, 0));
    assert_eq!(all[0].hold(), Some(10), "a hold it does not fill stays");
    all[0].forget_hold();
    assert_eq!(all[0].hold(), None);
}

#[test]
fn a_backend_that_never_queued_takes_its_peers_hold_until_it_learns_its_own() {
    let all = accounts(1);
    all[0].adopt_hold((0, 0));
    assert_eq!(all[0].hold(), None, "nothing to adopt");
    all[0].adopt_hold((4, 4));
    assert_eq!(all[0].held(), (4, 4));
    all[0].learn_hold(load(4, 0));
    assert_eq!(all[0].hold(), Some(5), "it runs all of it: the hold grows");
    all[0].adopt_hold((8, 8));
    assert_eq!(all[0].hold(), Some(5), "a hold of its own stays");
    all[0].learn_hold(load(3, 2));
    assert_eq!(all[0].held(), (3, 3), "it queued: its own measure");
}

#[test]
fn the_reserve_grows_to_what_the_requests_it_is_kept_for_had_at_once() {
    let all = accounts(1);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    all[0].learn_hold(load(8, 3));
    let (heavy, light) = (
        Cap::claiming(Claim::Leaves),
        Cap::claiming(Claim::Kept(Kept::default())),
    );
    let place = |cap: Cap| match place(&refs, cap, TextBytes(1), first) {
        Placing::Placed { seat, .. } => Some(seat),
        _ => None,
    };
    let mut seats: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
    assert_eq!(seats.len(), 7, "one of 8 kept");
    let kept: Vec<_> = (0..3).filter_map(|_| place(light)).collect();
    assert_eq!(kept.len(), 1, "the hold is full");
    seats.truncate(4);
    let kept: Vec<_> = kept
        .into_iter()
        .chain(place(light))
        .chain(place(light))
        .collect();
    assert_eq!(kept.len(), 3, "three kept-for requests at once");
    drop(kept);
    let more: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
    assert_eq!(more.len(), 1, "3 of 8 stay free for them");
    drop(more);
    for _ in 0..2 * KEPT_READS {
        all[0].learn_hold(load(4, 0));
    }
    let more: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
    assert_eq!(more.len(), 3, "two windows later, one of 8 again");
}

#[test]
fn a_kept_requests_new_conversation_is_placed_where_its_own_band_has_fewest_in_flight() {
    let all = accounts(2);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    let kept = |band| {
        Cap::claiming(Claim::Kept(Kept {
            band,
            ..Kept::default()
        }))
    };
    let on = |i: usize| {
        move |_: &[Candidate], _| Decision {
            index: i,
            ..first(&[], Asking::Take)
        }
    };
    // The backends the policy is asked to choose among last.
    let seen = |cap: Cap| {
        let mut seen = Vec::new();
        decide(&refs, cap, |c, _| {
            seen = c.iter().map(|c| c.id.0).collect();
            Decision::new(0, Outcome::Placed)
        });
        seen
    };
    let normal: Vec<_> = (0..3)
        .map(|_| place(&refs, kept(1), TextBytes(1), on(0)))
        .collect();
    let high = place(&refs, kept(2), TextBytes(1), on(1));
    assert_eq!(
        seen(kept(2)),
        [0],
        "normal's requests kept before do not count"
    );
    assert_eq!(seen(kept(1)), [1]);
    assert_eq!(seen(Cap::default()), [0, 1], "not kept: the policy's alone");
    drop((normal, high));
    assert_eq!(seen(kept(1)), [0, 1]);
}

#[test]
fn standing_slots_stay_free_on_a_held_backend_and_never_all_of_them() {
    let all = accounts(2);
    let standing = |standing| Cap::claiming(Claim::Open { standing });
    let place = |account: &Arc<Account>, cap: Cap| {
        let one = [account];
        (0..8)
            .map_while(|_| match place(&one, cap, TextBytes(1), first) {
                Placing::Placed { seat, .. } => Some(seat),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(place(&all[0], standing(1)).len(), 8, "no hold: none kept");
    all[0].learn_hold(load(4, 2));
    assert_eq!(place(&all[0], standing(1)).len(), 3, "one of 4 stays free");
    let kept = Cap::claiming(Claim::Kept(Kept::default()));
    let held = place(&all[0], standing(1));
    assert_eq!(place(&all[0], kept).len(), 1, "an arrival takes it");
    drop(held);
    all[1].learn_hold(load(1, 2));
    assert_eq!(place(&all[1], standing(1)).len(), 1, "never the only slot");
}

#[test]
fn a_request_leaving_the_reserve_leaves_the_kv_the_kept_ones_had_lately() {
    let all = accounts(1);
    let one = [&all[0]];
    let place = |cap: Cap| match place(&one, cap, TextBytes(1), first) {
        Placing::Placed { seat, .. } => Some(seat),
        _ => None,
    };
    let heavy = Cap {
        tokens: Tokens(250),
        ..Cap::claiming(Claim::Leaves)
    };
    let heavies = || (0..8).map_while(|_| place(heavy)).collect::<Vec<_>>();
    all[0].set_capacity(Some(Tokens(1_000)));
    all[0].learn_hold(load(16, 2));
    let answered = |tokens: usize| {
        let seat = place(Cap {
            tokens: Tokens(tokens),
            ..Cap::claiming(Claim::Kept(Kept::default()))
        });
        seat.inspect(Seat::answered)
    };
    let kept = answered(400);
    assert_eq!(heavies().len(), 2, "250 + 250 + the kept 400 fill 1,000");
    drop(kept);
    assert_eq!(
        heavies().len(),
        2,
        "what the kept one had lately stays free"
    );
    for _ in 0..2 * KEPT_READS {
        all[0].learn_hold(load(16, 2));
    }
    assert_eq!(heavies().len(), 4, "until two windows passed");
    let huge = answered(5_000);
    assert_eq!(heavies().len(), 2, "at most half the capacity is left");
    drop(huge);
    all[0].set_capacity(None);
    assert_eq!(heavies().len(), 8, "no capacity published: slots only");
}

#[test]
fn once_a_light_flows_context_is_evicted_where_kv_is_full_the_floods_leave_its_backends() {
    let all = accounts(4);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    let params = crate::policy::testing::params(0.5, 32);
    let selector = crate::policy::choose("least_load").unwrap().build(&params);
    for a in &all {
        a.set_capacity(Some(Tokens(2_000)));
        a.learn_hold(load(16, 2));
    }
    // On backend `i` of `among`, its home, predicted to find `matched` cached.
    let place_among = |among: &[&Arc<Account>], i: usize, cap: Cap, matched: Tokens| {
        let choose = |candidates: &[Candidate], _| {
            let index = (candidates.iter().position(|c| c.id == all[i].id)).unwrap_or(9);
            Decision {
                index,
                matched: matched.text(),
                home: Some(index),
                ..first(&[], Asking::Take)
            }
        };
        match place(among, cap, TextBytes(1), choose) {
            Placing::Placed { seat, .. } => Some(seat).inspect(Seat::answered),
            _ => None,
        }
    };
    // Among all backends, so that a light conversation placed here is no longer counted
    // where it was; a new one alone, where flow control would not move it.
    let place = |i: usize, cap: Cap, matched: Tokens| place_among(&refs, i, cap, matched);
    let new = |i: usize, cap: Cap| place_among(&[&all[i]], i, cap, Tokens(0));
    let light = |conversation: u128| Cap {
        tokens: Tokens(400),
        ..Cap::claiming(Claim::Kept(Kept {
            light: Some(conversation),
            ..Kept::default()
        }))
    };
    let flood = Cap {
        tokens: Tokens(100),
        ..Cap::claiming(Claim::Leaves)
    };
    let on = |i: usize, cap: Cap| place(i, cap, Tokens(0));
    // Conversation `c`'s turn predicted to find 200 tokens cached at backend `i` finds 10.
    let evicted = |i: usize, c: u128| {
        let seat = place(i, light(c), Tokens(200)).expect("placed");
        let report = Report {
            size: PromptSize::Tokens(Tokens(400)),
            prompt: Tokens(400),
            cached: Tokens(10),
        };
        seat.reported(&selector, report);
    };
    let protect = || protect_kv(all.iter().map(|a| &**a));
    let protected = || all.iter().map(|a| a.kv_kept()).collect::<Vec<_>>();
    let lights = [on(0, light(1)), on(1, light(2)), on(1, light(3))];
    let floods: Vec<_> = (0..4).map(|i| on(i, flood)).collect();
    assert!(floods.iter().all(Option::is_some));
    evicted(0, 1);
    protect();
    assert_eq!(
        protected(),
        [false; 4],
        "evicted where the prompts in flight (900 tokens) fill under half the KV"
    );
    let more: Vec<_> = (0..3).map(|_| on(1, flood)).collect();
    evicted(1, 2);
    protect();
    assert_eq!(
        protected(),
        [false, true, false, false],
        "evicted at 1,600 of 2,000: the backend of most of the light flow's 1,200 \
         tokens of conversations, for half again those"
    );
    assert!(on(1, flood).is_none(), "a flood leaves it");
    assert!(on(2, flood).is_some(), "and goes to the others");
    // Conversation 3 moves to backend 2 (flow control would move it to 1, kept for it).
    let moved = new(2, light(3));
    all[1].guard.move_home(3);
    protect();
    assert_eq!(
        protected(),
        [false, true, false, false],
        "kept while the flow is active, though it has as much on backends 0 and 2"
    );
    let opened = [new(3, light(4)), new(3, light(5))];
    protect();
    assert_eq!(
        protected(),
        [false, true, false, true],
        "one more for its 2,000 tokens: the one where it has the most"
    );
    let grown = [new(0, light(6)), new(2, light(7))];
    protect();
    assert_eq!(
        protected(),
        [true, true, false, true],
        "at most three quarters of the fleet for its 2,800"
    );
    drop((lights, more, moved, opened, grown));
    for _ in 0..HOME_READS {
        all.iter().for_each(|a| a.learn_hold(load(16, 2)));
    }
    protect();
    assert_eq!(protected(), [false; 4], "the light flow idle");
    let back = on(1, light(2));
    protect();
    assert!(back.is_some());
    assert_eq!(protected(), [false; 4], "back, and not evicted since");
}

#[test]
fn a_seat_counts_its_load_and_prefill_until_answered_and_dropped() {
    let all = accounts(2);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    let Placing::Placed { seat, index } = place(&refs, 0, TextBytes(100), first) else {
        panic!("not placed");
    };
    assert_eq!(
        (index, all[0].load(), all[0].pending()),
        (0, 1, TextBytes(70))
    );
    seat.answered();
    assert_eq!((all[0].load(), all[0].pending()), (1, TextBytes(0)));
    drop(seat);
    assert_eq!(all[0].load(), 0);
}

#[test]
fn a_seats_prompt_counts_as_sent_until_answered_or_dropped() {
    let all = accounts(1);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    let sent = Arc::new(crate::events::sent::Sent::default());
    let chain = [[1; 8], [2; 8]];
    let counted = || sent.matched(&chain).into_vec();
    let blocks = Tokens(2 * 16);
    for answer in [true, false] {
        let Placing::Placed { seat, .. } = place(&refs, 0, TextBytes(100), first) else {
            panic!("not placed");
        };
        seat.count_sent(sent.add(BackendId(0), &chain));
        assert_eq!(counted(), [(BackendId(0), blocks)]);
        if answer {
            seat.answered();
            assert_eq!(counted(), [], "answered: the engine's record has it");
        }
        drop(seat);
        assert_eq!(counted(), []);
    }
}

#[test]
fn the_limit_leaves_out_full_backends_and_reports_a_full_fleet() {
    let all = accounts(2);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    let Placing::Placed { seat: a, index } = place(&refs, 1, TextBytes(0), first) else {
        panic!("not placed");
    };
    assert_eq!(index, 0);
    // Backend 0 is full: the first candidate offered is now backend 1.
    let Placing::Placed { seat: b, index } = place(&refs, 1, TextBytes(0), first) else {
        panic!("not placed");
    };
    assert_eq!(index, 1);
    assert!(!open(&refs, 1));
    assert!(matches!(
        place(&refs, 1, TextBytes(0), first),
        Placing::Full
    ));
    drop((a, b));
    assert!(open(&refs, 1));
}

#[test]
fn a_cap_over_takes_that_many_slots_past_the_limit_and_the_hold() {
    let all = accounts(1);
    let refs: Vec<&Arc<Account>> = all.iter().collect();
    all[0].learn_hold(load(1, 1));
    assert_eq!(all[0].hold(), Some(1));
    let over = Cap {
        limit: 1,
        over: 1,
        ..Cap::default()
    };
    let Placing::Placed { seat: _one, .. } = place(&refs, 1, TextBytes(0), first) else {
        panic!("not placed");
    };
    assert!(!open(&refs, 1), "at its limit and its hold");
    let Placing::Placed { seat: _two, .. } = place(&refs, over, TextBytes(0), first) else {
        panic!("one past both");
    };
    assert!(!open(&refs, over), "no more than one past");
}

#[test]
fn a_request_leaving_the_reserve_waits_while_a_kept_one_prefills_on_a_held_backend() {
    let (account, freed) = counting();
    let (kept, reserve) = (
        Cap {
            limit: 8,
            ..Cap::claiming(Claim::Kept(Kept::default()))
        },
        Cap {
            limit: 8,
            ..Cap::claiming(Claim::Leaves)
        },
    );
    let Placing::Placed { seat, .. } = place(&[&account], kept, TextBytes(0), first) else {
        panic!("not placed");
    };
    assert!(account.open(reserve), "no hold learned: never held back");
    account.learn_hold(load(4, 1));
    assert!(
        !account.open(reserve),
        "guarded while the kept one prefills"
    );
    assert!(
        account.open(kept) && account.open(8),
        "only those leaving the reserve"
    );
    seat.answered();
    assert_eq!(freed.load(Relaxed), 1, "the guard lifting wakes a waiter");
    assert!(account.open(reserve), "open once it answered");
    seat.answered();
    drop(seat);
    assert_eq!(freed.load(Relaxed), 2, "lifted once, freed once");
}

/// An account, and how many times it called its hook.
fn counting() -> (Arc<Account>, Arc<AtomicUsize>) {
    let freed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&freed);
    let account = Account::new(BackendId(0), 0).on_free(move || {
        count.fetch_add(1, Relaxed);
    });
    (Arc::new(account), freed)
}

#[test]
fn a_freed_seat_calls_its_accounts_hook() {
    let (account, freed) = counting();
    let placed = place(&[&account], 0, TextBytes(0), first);
    drop(placed);
    assert_eq!(freed.load(Relaxed), 1);
}

#[test]
fn the_room_a_request_may_take_is_the_least_of_its_bounds() {
    let all = accounts(1);
    let account = &all[0];
    let room = |cap: Cap| account.room(cap).slots;
    assert_eq!(room(Cap::default()), None, "no limit, no hold: unbounded");
    assert_eq!(room(Cap::from(3)), Some(3));
    account.learn_hold(load(8, 1));
    account.learn_hold(load(8, 0));
    assert_eq!(
        account.held(),
        (10, 8),
        "probing a quarter past a ceiling of 8"
    );
    assert_eq!(room(Cap::from(3)), Some(3), "the limit under the hold");
    assert_eq!(room(Cap::default()), Some(10), "the hold");
    let kept = Cap::claiming(Claim::Kept(Kept::default()));
    assert_eq!(room(kept), Some(8), "kept: no further than the ceiling");
    assert_eq!(room(kept.at_home()), Some(10), "but at its home");
    let leaves = Cap::claiming(Claim::Leaves);
    assert_eq!(room(leaves), Some(7), "the ceiling less an eighth of it");
    assert!(account.room(leaves).leaves_kv);
    let standing = Cap::claiming(Claim::Open { standing: 2 });
    assert_eq!(
        room(standing),
        Some(6),
        "the ceiling less the standing slots"
    );
    let over = Cap { over: 1, ..leaves };
    assert!(account.room(over).admits(7) && !account.room(over).admits(8));
    let closed = Room {
        slots: Some(0),
        over: 1,
        leaves_kv: false,
    };
    assert!(!closed.admits(0), "closed, whatever it may take past");
}
