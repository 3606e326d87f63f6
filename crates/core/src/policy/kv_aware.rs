//! `kv_aware` (the default): each request goes where its conversation's KV already is, and
//! each new conversation where the fleet has room for it and it starts soonest.
//!
//! - **Whose conversation is this?** The conversation table ([`Conversations`]) knows
//!   where each conversation was last placed, by its anchor (the text up to its first
//!   user message) with its session key ([`Request::conversation`]), or by its anchor
//!   alone when that is not itself a shared prefix. A session's request that starts
//!   otherwise (a sub-agent, an agent's title request) is thus a conversation of its own.
//!   Router replicas share that table, so a conversation whose turns reach different
//!   replicas keeps one home. A home this router placed but whose index no longer holds
//!   the conversation's own history is taken as lost (evicted) and not followed.
//! - **Else, whose history is this?** The match beyond the deepest prefix that earlier
//!   texts continue in more than one way (a system prompt, a template) is the
//!   conversation's own history. At least [`MIN_PRIVATE`] of it on some backend make the
//!   request a continuation, at home on the backend with the longest match.
//! - **A continuation stays home**, unless home's live conversations (those expected back,
//!   a prompt they share counted once, as the KV holds it; see [`Conversations`]) overflow
//!   its KV while another backend has room: then it moves once, as a new conversation
//!   would be placed, instead of thrashing home's cache. A turn the engine refused, or
//!   that failed, holds no KV: the proxy releases it ([`Selector::released`]) and its
//!   conversation stops counting.
//! - **A new conversation** goes, among the backends with room for it (all of them when
//!   none has), to the one where its first token comes soonest: the prefill of what that
//!   backend does not hold, plus [`QUEUE_WEIGHT`] of the prefill already queued there. A
//!   hot prefix ([`Matches::hot`](crate::tree::Matches::hot)) counts as held everywhere,
//!   since every backend will soon hold it: a shared system prompt is worth little, a
//!   session's own context a lot. Room is counted in whole texts, as if live
//!   conversations shared nothing: with a shared prompt counted once there, every
//!   conversation of a prompt piled onto the backend that held it first and the rest of
//!   the fleet idled (docs/BENCHMARKS.md, sessions sharing long prompts).
//!
//! Where each sequence has a KV of its own (llama.cpp's slots, read from its `/props`),
//! room is also counted in live conversations, and a prefix other conversations share
//! does not count as held: a new conversation reuses it only by taking one of their slots.
//!
//! A decision names the conversation's home ([`Decision::home`]); an opening turn without a
//! session has none, its text being only its start. Flow control steers the requests it
//! keeps room for around this rule ([`ledger::place`](crate::ledger::place)), and may ask
//! for a request to be placed as a new conversation ([`Request::new`]).
//!
//! Backends with unknown capacity always have room. The constants were chosen in the lab
//! (`prefix-router lab --all`) for the mechanisms, not for one scenario; see docs/LAB.md.

use std::cmp::Reverse;
use std::sync::Arc;

use super::conversations::{Conversations, Live, Note};
use super::prefix::{Ask, PrefixPolicy, Rule};
use super::{Decision, Outcome, PolicyParams, Request, Selector, Ties, Turn};
use crate::BackendId;
use crate::units::TextBytes;

/// A conversation's own history a backend must hold to be its home (about 64 tokens):
/// less is a coincidence of text, not a conversation.
pub const MIN_PRIVATE: TextBytes = TextBytes(256);

/// Weight of the prefill queued on a backend against this request's own prefill there,
/// when a new conversation is placed: below 1, a held prefix is followed a little past
/// the point where recomputing it elsewhere would start sooner.
pub const QUEUE_WEIGHT: f64 = 0.3;

/// The rule.
pub struct KvAware {
    ties: Ties,
    /// This router's id in the conversation table.
    origin: u64,
    conversations: Arc<Conversations>,
}

/// The policy over a prefix index of its own and the conversation table replicas share
/// (`params.conversations`, else one of its own); not wrapped in session affinity, which
/// it weighs itself.
pub fn build(params: &PolicyParams) -> Selector {
    let conversations = (params.conversations.clone())
        .unwrap_or_else(|| Arc::new(Conversations::new(params.clock.clone())));
    let rule = KvAware {
        ties: Ties::new(params.seed),
        origin: params.seed,
        conversations: Arc::clone(&conversations),
    };
    let index = params.index();
    Selector::new(PrefixPolicy::new(&index, rule))
        .indexed(index)
        .with_conversations(conversations, params.seed)
}

/// One decision's view of the candidates.
struct View<'v> {
    ask: &'v Ask<'v, 'v, 'v>,
    /// Live conversations on each candidate.
    held: Vec<Live>,
}

impl View<'_> {
    fn matched(&self, i: usize) -> TextBytes {
        (self.ask.candidates[i].recorded).unwrap_or_else(|| self.ask.matched(i))
    }

    fn len(&self) -> usize {
        self.ask.candidates.len()
    }

    /// Whether candidate `i` has room for this conversation: its live conversations and
    /// this one fit in its KV even were each to hold its whole text apart, and in
    /// sequences where each has a KV of its own.
    fn room(&self, i: usize) -> bool {
        let (candidate, live) = (&self.ask.candidates[i], self.held[i]);
        let bytes = candidate.capacity.0 == 0
            || live.whole + self.ask.matches.total() <= candidate.capacity;
        bytes && (candidate.sequences == 0 || live.conversations < candidate.sequences)
    }

    fn overflowing(&self, i: usize) -> bool {
        let (candidate, live) = (&self.ask.candidates[i], self.held[i]);
        (candidate.capacity.0 > 0 && live.bytes > candidate.capacity)
            || (candidate.sequences > 0 && live.conversations > candidate.sequences)
    }

    /// How full candidate `i`'s KV is with live conversations, 0..: the larger of its
    /// bytes and, where each sequence has a KV of its own, its sequences.
    fn fill(&self, i: usize) -> f64 {
        let (candidate, live) = (&self.ask.candidates[i], self.held[i]);
        let bytes = live.whole.0 as f64 / candidate.capacity.0.max(1) as f64;
        let sequences = live.conversations as f64 / candidate.sequences.max(1) as f64;
        if candidate.sequences == 0 {
            bytes
        } else {
            bytes.max(sequences)
        }
    }

    /// The prefix of this request candidate `i` would not compute again. Where each
    /// sequence has a KV of its own, a prefix other conversations share is reused only by
    /// taking one of their places, so only this conversation's own history counts there;
    /// elsewhere a hot prefix counts as held.
    fn reused(&self, i: usize) -> TextBytes {
        let matched = self.matched(i);
        if self.ask.candidates[i].sequences == 0 {
            return matched.max(self.ask.matches.hot());
        }
        let own = matched.saturating_sub(self.ask.matches.shared());
        if own >= MIN_PRIVATE {
            matched
        } else {
            TextBytes(0)
        }
    }

    /// Whether the request names its conversation: by a session, or by an anchor that is
    /// not itself a prefix other texts continue.
    fn named(&self) -> bool {
        let request = self.ask.request;
        request.session.is_some() || self.anchor() > self.ask.matches.shared()
    }

    fn anchor(&self) -> TextBytes {
        self.ask.request.anchor()
    }
}

impl KvAware {
    /// The backend holding this request's conversation, if any.
    fn home(&self, view: &View) -> Option<usize> {
        let known = view.named().then(|| self.known(view)).flatten();
        if let Some((i, origin)) = known {
            let own = view
                .matched(i)
                .saturating_sub(view.anchor().max(view.ask.matches.shared()));
            let lost = origin == self.origin && own < MIN_PRIVATE;
            if !lost {
                return Some(i);
            }
        }
        let shared = view.ask.matches.shared();
        let own = |i: usize| view.matched(i).saturating_sub(shared);
        if (0..view.len()).any(|i| own(i) >= MIN_PRIVATE) {
            let candidates = view.ask.candidates;
            return Some(self.ties.best(Turn::of(view.ask.request), view.len(), |i| {
                (
                    view.matched(i),
                    Reverse(candidates[i].pending),
                    Reverse(candidates[i].load),
                )
            }));
        }
        known.map(|(i, _)| i)
    }

    /// The candidate the conversation table places this conversation on, and who placed it.
    fn known(&self, view: &View) -> Option<(usize, u64)> {
        let conversation = view.ask.request.conversation();
        let (backend, origin) = self.conversations.home_of(conversation)?;
        let i = view.ask.candidates.iter().position(|c| c.id == backend)?;
        Some((i, origin))
    }

    /// Where a new conversation starts soonest, among the backends with room for it.
    fn place(&self, view: &View) -> usize {
        let (candidates, matches) = (view.ask.candidates, view.ask.matches);
        let any_room = (0..view.len()).any(|i| view.room(i));
        let cost = |i: usize| {
            let fresh = matches.total().saturating_sub(view.reused(i));
            fresh.0 as f64 + QUEUE_WEIGHT * candidates[i].pending.0 as f64
        };
        self.ties.best(Turn::of(view.ask.request), view.len(), |i| {
            (
                !any_room || view.room(i),
                Reverse((cost(i) * 16.0) as u64),
                Reverse((view.fill(i) * 1e6) as u64),
                Reverse(candidates[i].load),
            )
        })
    }
}

impl Rule for KvAware {
    fn decide(&self, ask: &Ask) -> Decision {
        let held = (self.conversations).held(ask.candidates.iter().map(|c| c.id));
        let view = View { ask, held };
        let request = ask.request;
        let home = if request.new { None } else { self.home(&view) };
        let (index, outcome) = match home {
            Some(home)
                if view.overflowing(home) && (0..view.len()).any(|j| j != home && view.room(j)) =>
            {
                (self.place(&view), Outcome::Imbalance)
            }
            Some(home) => (home, Outcome::PrefixHit),
            None => (self.place(&view), Outcome::Placed),
        };
        // An opening turn's text is only its start, which other conversations may share.
        let own = request.session.is_some() || !request.text.is_opening();
        Decision {
            index,
            outcome,
            matched: view.matched(index),
            home: home.filter(|_| own),
        }
    }

    fn placed(&self, request: &Request, backend: BackendId, shared: TextBytes) {
        self.conversations.note(Note {
            conversation: request.conversation(),
            backend,
            // A note of 0 bytes is a release: a placement counts at least 1.
            bytes: request.size().max(TextBytes(1)),
            // Only a start before the conversation's own history (a system prompt) is
            // held once for many: a fork of its own history is its own.
            shared: shared.min(request.anchor()),
            origin: self.origin,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Candidate;
    use crate::policy::testing::*;
    use crate::request::RoutingText;

    const PROMPT: &str = include_str!("kv_aware.rs");

    /// The shared prompt, then `user`'s first message (the anchor ends there), then `more`.
    fn conversation(user: &'static str, more: &[&'static str]) -> RoutingText<'static> {
        let mut t = RoutingText::default();
        t.push(PROMPT.as_bytes());
        t.push(user.as_bytes());
        t.mark_anchor();
        more.iter().for_each(|m| t.push(m.as_bytes()));
        t
    }

    fn selector() -> Selector {
        build(&params(0.3, 64))
    }

    /// `n` idle candidates with `capacity` bytes of KV each.
    fn fleet(n: usize, capacity: usize) -> Vec<Candidate> {
        let mut c = candidates(&vec![0; n]);
        c.iter_mut().for_each(|c| c.capacity = TextBytes(capacity));
        c
    }

    fn user(i: usize) -> &'static str {
        Box::leak(format!("user {i}: {}", "a distinct first question ".repeat(20)).into_boxed_str())
    }

    #[test]
    fn new_conversations_sharing_a_hot_prompt_spread_over_the_fleet() {
        let s = selector();
        let fleet = fleet(4, 3 * PROMPT.len());
        let mut per_backend = [0; 4];
        for i in 0..8 {
            let t = conversation(user(i), &[]);
            per_backend[s.select(&request(&t, None), &fleet).index] += 1;
        }
        assert!(per_backend.iter().all(|&n| n == 2), "{per_backend:?}");
    }

    #[test]
    fn a_decision_names_the_conversations_home_but_an_opening_turn_has_none() {
        let s = selector();
        let fleet = fleet(3, 100 * PROMPT.len());
        let first = conversation(user(0), &[]);
        let placed = s.select(&request(&first, None), &fleet);
        assert_eq!((placed.outcome, placed.home), (Outcome::Placed, None));
        let again = s.select(&request(&first, None), &fleet);
        assert_eq!(again.outcome, Outcome::PrefixHit, "the same start");
        assert_eq!(
            again.home, None,
            "but only its start: no history of its own"
        );
        let answer = "assistant: a long answer and a tool result ".repeat(30);
        let turn = conversation(user(0), &[Box::leak(answer.into_boxed_str())]);
        let next = s.select(&request(&turn, None), &fleet);
        assert_eq!(
            (next.outcome, next.home),
            (Outcome::PrefixHit, Some(placed.index))
        );
        let session = s.select(&request(&first, Some("s")), &fleet);
        assert_eq!(
            session.home,
            Some(placed.index),
            "a session names its conversation"
        );
    }

    #[test]
    fn engines_with_a_kv_per_sequence_get_new_conversations_by_their_free_places() {
        let place = |sequences: usize| {
            let s = selector();
            let mut fleet = fleet(4, 1000 * PROMPT.len());
            fleet.iter_mut().for_each(|c| c.sequences = sequences);
            let mut per_backend = [0; 4];
            for i in 0..8 {
                let t = conversation(user(i), &[]);
                per_backend[s.select(&request(&t, None), &fleet).index] += 1;
            }
            per_backend
        };
        // A shared pool with room: the shared prompt is reused where it is held.
        assert_eq!(place(0).iter().max(), Some(&8));
        // Two slots each: reusing the prompt would take another conversation's slot.
        assert_eq!(place(2), [2, 2, 2, 2]);
    }

    #[test]
    fn a_conversation_stays_with_its_own_context_even_on_a_busier_backend() {
        let s = selector();
        let mut fleet = fleet(3, 100 * PROMPT.len());
        for i in 0..3 {
            let first = conversation(user(i), &[]);
            s.select(&request(&first, None), &fleet);
        }
        let first = conversation(user(7), &[]);
        let home = s.select(&request(&first, None), &fleet).index;
        fleet[home].pending = TextBytes(4 * PROMPT.len());
        fleet[home].load = 5;
        let turn = "assistant: a long answer and a tool result ".repeat(30);
        let next = conversation(user(7), &[Box::leak(turn.into_boxed_str())]);
        let d = s.select(&request(&next, None), &fleet);
        assert_eq!((d.index, d.outcome), (home, Outcome::PrefixHit));
        assert!(d.matched.0 > PROMPT.len());
    }

    #[test]
    fn a_full_backend_sheds_new_conversations_and_moves_one_only_once_its_kv_overflows() {
        let s = selector();
        let p = PROMPT.len();
        let fleet = fleet(3, 4 * p);
        let first = |i| conversation(user(i), &[]);
        let home = s.select(&request(&first(0), None), &fleet).index;
        // New conversations on the prompt go where it is while their whole texts fit...
        for i in 1..3 {
            assert_eq!(s.select(&request(&first(i), None), &fleet).index, home);
        }
        // ...and then to a backend with room.
        let new = s.select(&request(&first(3), None), &fleet);
        assert_ne!(new.index, home);
        assert_eq!(new.outcome, Outcome::Placed);
        // Conversation 0 grows: whole, the three texts overflow home's KV, but home holds
        // the prompt once, so its next turn stays.
        let output: &'static str = Box::leak("tool output ".repeat(p * 3 / 24).into_boxed_str());
        let grown = |i, more: &'static str| conversation(user(i), &[output, more]);
        for more in ["", "and the next question"] {
            let stays = s.select(&request(&grown(0, more), None), &fleet);
            assert_eq!((stays.index, stays.outcome), (home, Outcome::PrefixHit));
        }
        // Conversation 1 grows alike: now their own histories and the prompt overflow it,
        // and conversation 0's next turn leaves for a backend with room.
        assert_eq!(s.select(&request(&grown(1, ""), None), &fleet).index, home);
        let moved = s.select(&request(&grown(0, "and another one"), None), &fleet);
        assert_eq!(
            (moved.outcome, moved.home),
            (Outcome::Imbalance, Some(home))
        );
        assert_ne!(moved.index, home);
    }

    #[test]
    fn an_explicit_session_stays_even_when_its_text_is_not_remembered() {
        let s = selector();
        let fleet = fleet(3, 100 * PROMPT.len());
        let first = |more: &[&'static str]| {
            let mut t = RoutingText::default();
            t.push(b"first question of the session");
            t.mark_anchor();
            more.iter().for_each(|m| t.push(m.as_bytes()));
            t
        };
        let home = s.select(&request(&first(&[]), Some("s1")), &fleet).index;
        // Too short to be remembered as its own history: the session keeps it home.
        let next = first(&[" and a short answer"]);
        for _ in 0..3 {
            assert_eq!(s.select(&request(&next, Some("s1")), &fleet).index, home);
        }
    }

    #[test]
    fn a_sessions_request_with_a_start_of_its_own_is_placed_as_a_new_conversation() {
        let s = selector();
        let mut fleet = fleet(4, 100 * PROMPT.len());
        let main = conversation(user(1), &[]);
        let home = s.select(&request(&main, Some("s1")), &fleet).index;
        fleet[home].pending = TextBytes(1 << 30);
        // The session's title request (a start no backend holds) does not queue behind
        // the session's home...
        let title = text("write a title for this conversation");
        let d = s.select(&request(&title, Some("s1")), &fleet);
        assert_ne!(d.index, home, "{d:?}");
        // ...while the session's own next turn stays there.
        let next = conversation(user(1), &["an answer and a question"]);
        assert_eq!(s.select(&request(&next, Some("s1")), &fleet).index, home);
    }
}
