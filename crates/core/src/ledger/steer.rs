//! Flow control around the policy, as session affinity wraps one
//! ([`Sticky`](crate::policy::Sticky)): the policy knows nothing of flows, and flow control
//! narrows the candidates it is asked to choose among.
//!
//! A request the reserve is kept for is looked at first: the policy is asked where it
//! would go, remembering nothing ([`Asking::Look`]).
//!
//! - Where the policy names the request's conversation's home ([`Decision::home`]), the
//!   conversation stays there, even where the policy would move it off a home whose KV
//!   overflows: its flow's reserve is kept there. But a light flow's conversation whose
//!   home's KV is not kept for light flows moves, once, to a backend whose KV is
//!   ([`protect_kv`](super::protect_kv)), with room for it: it pays one prefill for turns
//!   its tenant's flood no longer evicts there.
//! - Where the policy would place it as a new conversation (by room, or by its start
//!   alone: an opening turn), it places it so ([`Asking::New`]) among the backends ranked
//!   first: those whose KV is kept for a light flow, with room; then those where the
//!   requests of its band kept a reserve for have the fewest in flight. Those stay home,
//!   where the reserve kept for them is a slot or two, so a light flow whose new
//!   conversations followed one shared prompt to one backend would wait there for each
//!   other's slots.
//! - Where the policy places by a rule of its own that names no home (a hash, a rotation,
//!   the load, `kv_aware` moving an opening turn off a backend whose KV overflows), that
//!   stands.
//!
//! Every other request is the policy's alone, asked once.

use std::cmp::Reverse;
use std::sync::Arc;

use smallvec::{SmallVec, smallvec};

use super::{Account, Cap};
use crate::policy::{Asking, Candidate, Decision, Outcome};

/// Asks `choose` for a request under `cap` among `accounts[open]`, steered as the module
/// says: the decision's index (and home) are positions in `open` (past its end when the
/// policy chose none).
pub(super) fn steer(
    cap: Cap,
    accounts: &[&Arc<Account>],
    open: &[usize],
    mut choose: impl FnMut(&[Candidate], Asking) -> Decision,
) -> Decision {
    let all: SmallVec<[Candidate; 16]> = open.iter().map(|&i| accounts[i].candidate()).collect();
    let Some(band) = cap.kept_band() else {
        return choose(&all, Asking::Take);
    };
    let account = |j: usize| accounts[open[j]];
    let kv_kept = |j: usize| cap.light() && account(j).guard.kept();
    let protected = |j: usize| kv_kept(j) && account(j).keeps_room_for(cap.tokens);
    let moves = (0..open.len()).any(protected);
    let looked = choose(&all, Asking::Look);
    let home = looked.home.filter(|&h| h < open.len());
    let new = matches!(looked.outcome, Outcome::Placed | Outcome::PrefixHit);
    let (among, asking): (SmallVec<[usize; 16]>, _) = match home {
        Some(home) if kv_kept(home) || !moves => (smallvec![home], Asking::Take),
        None if !new => ((0..open.len()).collect(), Asking::Take),
        _ => {
            let rank = |j: usize| (protected(j), Reverse(account(j).reserve.in_band(band)));
            let first = (0..open.len()).map(rank).max();
            let ranked = (0..open.len()).filter(|&j| Some(rank(j)) == first);
            (ranked.collect(), Asking::New)
        }
    };
    let narrowed: SmallVec<[Candidate; 16]> = among.iter().map(|&j| all[j]).collect();
    let decision = choose(&narrowed, asking);
    let position = |i: usize| among.get(i).copied();
    Decision {
        index: position(decision.index).unwrap_or(open.len()),
        home: decision.home.and_then(position),
        ..decision
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::BackendId;
    use crate::ledger::{Claim, Kept};
    use crate::units::Tokens;

    /// Three open backends of 1,000 tokens of KV each.
    fn fleet() -> Vec<Arc<Account>> {
        (0..3)
            .map(|i| {
                let account = Account::new(BackendId(i), u64::from(i));
                account.set_capacity(Some(Tokens(1_000)));
                Arc::new(account)
            })
            .collect()
    }

    fn cap(light: bool) -> Cap {
        Cap {
            tokens: Tokens(100),
            ..Cap::claiming(Claim::Kept(Kept {
                light: light.then_some(7),
                ..Kept::default()
            }))
        }
    }

    /// Steers a request under `cap` whose policy names `home` (and would go to
    /// `policy`): the ids of the backends it was asked to take among, by turn.
    fn asked(
        all: &[Arc<Account>],
        cap: Cap,
        home: Option<usize>,
        policy: usize,
    ) -> (Vec<(Asking, Vec<u32>)>, usize) {
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let seen = RefCell::new(Vec::new());
        let choose = |candidates: &[Candidate], turn| {
            let ids = candidates.iter().map(|c| c.id.0).collect();
            seen.borrow_mut().push((turn, ids));
            let outcome = match home {
                Some(h) if h != policy => Outcome::Imbalance,
                Some(_) => Outcome::PrefixHit,
                None => Outcome::Placed,
            };
            Decision {
                home: home.filter(|_| candidates.len() == all.len()),
                ..Decision::new(policy.min(candidates.len() - 1), outcome)
            }
        };
        let decision = steer(cap, &refs, &[0, 1, 2], choose);
        (seen.into_inner(), decision.index)
    }

    #[test]
    fn a_request_not_kept_is_the_policys_alone_asked_once() {
        let (seen, index) = asked(&fleet(), Cap::default(), Some(1), 2);
        assert_eq!(seen, [(Asking::Take, vec![0, 1, 2])]);
        assert_eq!(index, 2, "moved off its home, as the policy says");
    }

    #[test]
    fn a_kept_conversation_stays_home_though_the_policy_would_move_it() {
        let (seen, index) = asked(&fleet(), cap(false), Some(1), 2);
        assert_eq!(
            seen,
            [(Asking::Look, vec![0, 1, 2]), (Asking::Take, vec![1])]
        );
        assert_eq!(index, 1);
    }

    #[test]
    fn a_light_conversation_moves_to_a_backend_kept_for_light_flows_with_room() {
        let all = fleet();
        all[2].guard.keep(true);
        let (seen, index) = asked(&all, cap(true), Some(0), 0);
        assert_eq!(seen[1], (Asking::New, vec![2]), "it moves");
        assert_eq!(index, 2);
        let (seen, _) = asked(&all, cap(false), Some(0), 0);
        assert_eq!(seen[1], (Asking::Take, vec![0]), "not light: it stays");
        all[0].guard.keep(true);
        let (seen, _) = asked(&all, cap(true), Some(0), 0);
        assert_eq!(
            seen[1],
            (Asking::Take, vec![0]),
            "its home is kept: it stays"
        );
        all[0].guard.keep(false);
        all[2].note_home(1, Tokens(700));
        let (seen, _) = asked(&all, cap(true), Some(0), 0);
        assert_eq!(seen[1], (Asking::Take, vec![0]), "no room there: it stays");
        let (seen, _) = asked(&all, cap(true), None, 0);
        assert_eq!(seen[1], (Asking::New, vec![0, 1, 2]), "new: anywhere");
    }

    #[test]
    fn a_placement_by_a_rule_of_the_policys_own_stands() {
        let all = fleet();
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let mut seen = Vec::new();
        let hashed = |candidates: &[Candidate], asking| {
            seen.push((asking, candidates.len()));
            Decision::new(1, Outcome::Hashed)
        };
        let decision = steer(cap(true), &refs, &[0, 1, 2], hashed);
        assert_eq!(seen, [(Asking::Look, 3), (Asking::Take, 3)]);
        assert_eq!(decision.index, 1);
    }
}
