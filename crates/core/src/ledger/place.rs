//! Placement: which of a fleet's accounts are open to a request under its [`Cap`], the
//! policy's choice among them as candidates, and the seat taken on the chosen one.

use std::sync::Arc;

use smallvec::SmallVec;

use super::steer::steer;
use super::{Account, Cap, Seat};
use crate::policy::{Asking, Candidate, Decision};
use crate::units::TextBytes;

/// What [`place`] did.
#[derive(Debug)]
pub enum Placing {
    /// Placed on `accounts[index]`.
    Placed {
        /// The seat, in flight until it drops.
        seat: Seat,
        /// Its backend's position in the accounts given.
        index: usize,
    },
    /// Every backend is at the in-flight limit.
    Full,
    /// A concurrent placement took the last slot of the backend chosen: try again.
    Taken,
}

/// Whether some of `accounts` takes one more request under `cap` and its learnt hold.
pub fn open(accounts: &[&Arc<Account>], cap: impl Into<Cap>) -> bool {
    let cap = cap.into();
    accounts.iter().any(|a| a.open(cap))
}

/// Places a request of `text` routing text on one of `accounts` open under `cap` (a
/// `usize` is an in-flight limit, 0: none): `choose` picks among them as candidates (the
/// policy: asked once, or, for a request the reserve is kept for, first to look
/// ([`Asking::Look`]: remembering nothing) and then among the candidates flow control
/// narrows to, as `ledger/steer.rs` says: a conversation stays at the home the policy
/// names, unless a light flow's moves to a backend whose KV is kept for it; anything the
/// policy would place as new goes first where its band has the fewest kept requests in
/// flight), and the chosen backend counts the request in flight and its text not
/// expected cached as pending prefill.
pub fn place(
    accounts: &[&Arc<Account>],
    cap: impl Into<Cap>,
    text: TextBytes,
    choose: impl FnMut(&[Candidate], Asking) -> Decision,
) -> Placing {
    let cap = cap.into();
    let Some(decided) = choice(accounts, cap, choose) else {
        return Placing::Full;
    };
    let Some((index, decision)) = decided else {
        return Placing::Taken;
    };
    let prefill = text.saturating_sub(decision.matched);
    let Some(seat) = accounts[index].take(cap, prefill, decision) else {
        return Placing::Taken;
    };
    if let Some(conversation) = cap.conversation() {
        for (i, account) in accounts.iter().enumerate() {
            match i == index {
                true => account.note_home(conversation, cap.tokens),
                false => account.guard.move_home(conversation),
            }
        }
    }
    Placing::Placed { seat, index }
}

/// What [`place`] would choose, without taking a seat (`POST /route`): the chosen
/// account's position in `accounts` and the decision; `None` when every one is full
/// under `cap`.
pub fn decide(
    accounts: &[&Arc<Account>],
    cap: impl Into<Cap>,
    choose: impl FnMut(&[Candidate], Asking) -> Decision,
) -> Option<(usize, Decision)> {
    choice(accounts, cap.into(), choose).flatten()
}

/// Where `choose` would place a request under `cap` if every one of `accounts` had room
/// (the caller asks without remembering anything): the chosen position and the decision;
/// `None` when it chose none of them.
pub fn unbounded(
    accounts: &[&Arc<Account>],
    cap: Cap,
    choose: impl FnMut(&[Candidate], Asking) -> Decision,
) -> Option<(usize, Decision)> {
    let all: SmallVec<[usize; 16]> = (0..accounts.len()).collect();
    let decision = steer(cap, accounts, &all, choose);
    (decision.index < accounts.len()).then_some((decision.index, decision))
}

/// `choose` among the accounts open under `cap`, as candidates, steered (as [`place`]):
/// `None` when there are none, `Some(None)` when it chose none of them.
fn choice(
    accounts: &[&Arc<Account>],
    cap: Cap,
    choose: impl FnMut(&[Candidate], Asking) -> Decision,
) -> Option<Option<(usize, Decision)>> {
    let open: SmallVec<[usize; 16]> = (0..accounts.len())
        .filter(|&i| accounts[i].open(cap))
        .collect();
    if open.is_empty() {
        return None;
    }
    let decision = steer(cap, accounts, &open, choose);
    Some(open.get(decision.index).map(|&index| (index, decision)))
}
