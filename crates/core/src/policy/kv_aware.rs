//! `kv_aware` (the default): each request goes where its conversation's KV already is, and
//! each new conversation where the fleet has room for it and it starts soonest.
//!
//! - **Whose history is this?** The match beyond the deepest prefix that earlier texts
//!   continue in more than one way (a system prompt, a template) is the conversation's
//!   own history. At least [`MIN_PRIVATE`] bytes of it on some backend make the request a
//!   continuation, at home on the backend with the longest match. A conversation the
//!   index has lost (evicted, or too short yet) is still found in the conversation table:
//!   by its session key, or by its anchor when the anchor is not itself a shared prefix.
//! - **A continuation stays home**, unless home's live footprint (the sizes of the
//!   conversations active there in the last [`LIVE_HORIZON`]) overflows its KV while
//!   another backend has room: then it moves once, as a new conversation would be placed,
//!   instead of thrashing home's cache.
//! - **A new conversation** goes, among the backends with room for it (all of them when
//!   none has), to the one where its first token comes soonest: the prefill of what that
//!   backend does not hold, plus [`QUEUE_WEIGHT`] of the prefill already queued there. A
//!   hot prefix ([`Matches::hot`](crate::tree::Matches::hot)) counts as held everywhere,
//!   since every backend will soon hold it: a shared system prompt is worth little, a
//!   session's own context a lot.
//!
//! Backends with unknown capacity always have room. The constants were chosen in the lab
//! (`prefix-router lab --all`) for the mechanisms, not for one scenario; see the README.

use std::cmp::Reverse;
use std::time::Duration;

use super::footprint::{Footprints, MAX_CONVERSATIONS};
use super::prefix::{Ask, PrefixPolicy, Rule};
use super::{Decision, Outcome, Policy, PolicyParams, Request, Ties};
use crate::BackendId;

/// Bytes of a conversation's own history a backend must hold to be its home (about 64
/// tokens): fewer is a coincidence of text, not a conversation.
pub const MIN_PRIVATE: usize = 256;

/// Idle time after which a conversation no longer counts in its backend's footprint.
pub const LIVE_HORIZON: Duration = Duration::from_secs(30);

/// Idle time after which the conversation table forgets a conversation.
pub const CONVERSATION_TTL: Duration = Duration::from_secs(1800);

/// Weight of the prefill queued on a backend against this request's own prefill there,
/// when a new conversation is placed: below 1, a held prefix is followed a little past
/// the point where recomputing it elsewhere would start sooner.
pub const QUEUE_WEIGHT: f64 = 0.3;

/// The rule.
pub struct KvAware {
    ties: Ties,
    conversations: Footprints,
}

pub fn build(params: &PolicyParams) -> Box<dyn Policy> {
    let clock = params.clock.clone();
    let rule = KvAware {
        ties: Ties::new(params.seed),
        conversations: Footprints::new(LIVE_HORIZON, CONVERSATION_TTL, MAX_CONVERSATIONS, clock),
    };
    Box::new(PrefixPolicy::new(params, rule))
}

/// One decision's view of the candidates.
struct View<'v> {
    ask: &'v Ask<'v, 'v, 'v>,
    /// Bytes of live conversations on each candidate.
    held: Vec<usize>,
}

impl View<'_> {
    fn matched(&self, i: usize) -> usize {
        self.ask.matches.matched(self.ask.candidates[i].id)
    }

    fn len(&self) -> usize {
        self.ask.candidates.len()
    }

    /// Whether candidate `i` can take this conversation without overflowing its KV.
    fn room(&self, i: usize) -> bool {
        let capacity = self.ask.candidates[i].capacity;
        capacity == 0 || self.held[i] + self.ask.matches.total() <= capacity
    }

    fn overflowing(&self, i: usize) -> bool {
        let capacity = self.ask.candidates[i].capacity;
        capacity > 0 && self.held[i] > capacity
    }
}

impl KvAware {
    /// The backend holding this request's conversation, if any.
    fn home(&self, view: &View) -> Option<usize> {
        let shared = view.ask.matches.shared();
        let own = |i: usize| view.matched(i).saturating_sub(shared);
        if (0..view.len()).any(|i| own(i) >= MIN_PRIVATE) {
            let candidates = view.ask.candidates;
            return Some(self.ties.best(view.len(), |i| {
                (
                    view.matched(i),
                    Reverse(candidates[i].pending),
                    Reverse(candidates[i].load),
                )
            }));
        }
        let request = view.ask.request;
        let anchor_is_own = request.text.anchor_len() > shared;
        if request.session.is_none() && !anchor_is_own {
            return None;
        }
        let backend = self.conversations.backend_of(request.conversation())?;
        view.ask.candidates.iter().position(|c| c.id == backend)
    }

    /// Where a new conversation starts soonest, among the backends with room for it.
    fn place(&self, view: &View) -> usize {
        let (candidates, matches) = (view.ask.candidates, view.ask.matches);
        let any_room = (0..view.len()).any(|i| view.room(i));
        let held = matches.hot();
        let cost = |i: usize| {
            let fresh = matches.total().saturating_sub(view.matched(i).max(held));
            fresh as f64 + QUEUE_WEIGHT * candidates[i].pending as f64
        };
        let fill = |i: usize| view.held[i] as f64 / candidates[i].capacity.max(1) as f64;
        self.ties.best(view.len(), |i| {
            (
                !any_room || view.room(i),
                Reverse((cost(i) * 16.0) as u64),
                Reverse((fill(i) * 1e6) as u64),
                Reverse(candidates[i].load),
            )
        })
    }
}

impl Rule for KvAware {
    fn decide(&self, ask: &Ask) -> Decision {
        let held = (self.conversations).of(ask.candidates.iter().map(|c| c.id));
        let view = View { ask, held };
        let (index, outcome) = match self.home(&view) {
            Some(home)
                if view.overflowing(home) && (0..view.len()).any(|j| j != home && view.room(j)) =>
            {
                (self.place(&view), Outcome::Imbalance)
            }
            Some(home) => (home, Outcome::PrefixHit),
            None => (self.place(&view), Outcome::Placed),
        };
        Decision {
            index,
            outcome,
            matched: view.matched(index),
        }
    }

    fn placed(&self, request: &Request, backend: BackendId) {
        (self.conversations).note(request.conversation(), backend, request.text.len());
    }

    fn retain(&self, live: &dyn Fn(BackendId) -> bool) {
        self.conversations.retain(live);
    }

    fn keeps_sessions(&self) -> bool {
        true
    }
}
