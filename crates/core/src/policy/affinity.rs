//! Session affinity on top of any policy: a request with a session key goes to the backend
//! that last served the session while that backend is ready and not past the imbalance
//! bound; otherwise the policy places it and the session follows.

use std::sync::Arc;
use std::time::Duration;

use super::{Candidate, Decision, Outcome, Policy, Request, Sessions, SharedTunables, overloaded};
use crate::BackendId;
use crate::clock::{Clock, Monotonic};
use crate::tree::TreeStats;

/// The policy with session affinity: what the proxy asks to choose a backend.
pub struct Selector {
    policy: Box<dyn Policy>,
    sessions: Sessions,
    tunables: SharedTunables,
    upkeep_due: Box<dyn Fn() + Send + Sync>,
}

impl Selector {
    /// `policy` with sessions that expire after `session_ttl` idle on the monotonic clock.
    pub fn new(policy: Box<dyn Policy>, tunables: SharedTunables, session_ttl: Duration) -> Self {
        Selector::with_clock(
            policy,
            tunables,
            session_ttl,
            Arc::new(Monotonic::default()),
        )
    }

    /// Like [`Self::new`], with session idleness measured on `clock`.
    pub fn with_clock(
        policy: Box<dyn Policy>,
        tunables: SharedTunables,
        session_ttl: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Selector {
            policy,
            sessions: Sessions::new(session_ttl, super::sessions::MAX_SESSIONS, clock),
            tunables,
            upkeep_due: Box::new(|| {}),
        }
    }

    /// Calls `signal` whenever a decision finds upkeep due before its interval (the tree
    /// grew by a tenth of its budget), so that memory stays bounded however fast text
    /// arrives: the caller then runs [`Self::trim_tree`]. `signal` must be cheap.
    pub fn on_upkeep_due(mut self, signal: impl Fn() + Send + Sync + 'static) -> Self {
        self.upkeep_due = Box::new(signal);
        self
    }

    /// The reloadable parameters this selector and its policy read.
    pub fn tunables(&self) -> &SharedTunables {
        &self.tunables
    }

    /// Picks one of `candidates` (never empty) for `request`.
    pub fn select(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let decision = self.by_session(request, candidates).unwrap_or_else(|| {
            let decision = self.policy.choose(request, candidates);
            if let Some(key) = request.session {
                self.sessions.set(key, candidates[decision.index].id);
            }
            decision
        });
        if self.policy.needs_upkeep() {
            (self.upkeep_due)();
        }
        decision
    }

    fn by_session(&self, request: &Request, candidates: &[Candidate]) -> Option<Decision> {
        if self.policy.keeps_sessions() {
            return None;
        }
        let key = request.session?;
        let backend = self.sessions.get(key)?;
        let index = candidates.iter().position(|c| c.id == backend)?;
        if overloaded(
            candidates[index].load,
            candidates,
            &self.tunables.get().balance,
        ) {
            return None;
        }
        let matched = self.policy.record(request, backend);
        self.sessions.set(key, backend);
        Some(Decision {
            index,
            outcome: Outcome::Session,
            matched,
        })
    }

    /// Periodic upkeep: expire sessions, evict the tree, forget dead backends. Returns the
    /// bytes of remembered text evicted.
    pub fn maintain(&self, live: &dyn Fn(BackendId) -> bool) -> usize {
        self.sessions.sweep(live);
        self.policy.maintain(live)
    }

    /// Evicts the tree down to its budget, and nothing else (sessions are swept by
    /// [`Self::maintain`]). Returns the bytes of remembered text evicted.
    pub fn trim_tree(&self) -> usize {
        self.policy.maintain(&|_| true)
    }

    /// Sizes what the policy remembers of `backend` to `tokens` of KV (its capacity), or
    /// back to the configured size (`None`).
    pub fn set_budget(&self, backend: BackendId, tokens: Option<usize>) {
        self.policy.set_budget(backend, tokens);
    }

    /// The tokens of KV the policy remembers at most for `backend`, if any.
    pub fn budget(&self, backend: BackendId) -> Option<usize> {
        self.policy.budget(backend)
    }

    /// Learns from a response: `backend` reported `cached_tokens` cached where the policy
    /// predicted `predicted` bytes of routing text (a decision's `matched`).
    pub fn observe(&self, backend: BackendId, predicted: usize, cached_tokens: u64) {
        let delivered = usize::try_from(cached_tokens).unwrap_or(usize::MAX);
        let delivered = delivered.saturating_mul(crate::TEXT_BYTES_PER_TOKEN);
        self.policy.observe(backend, predicted, delivered);
    }

    /// Prefix-tree figures, if the policy keeps a tree.
    pub fn tree_stats(&self) -> Option<TreeStats> {
        self.policy.tree_stats()
    }

    /// Sessions remembered.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::choose;
    use crate::policy::testing::*;

    fn selector(name: &str) -> Selector {
        let params = params(0.3, 4);
        let policy = choose(name).unwrap().build(&params);
        Selector::new(policy, params.tunables, Duration::from_secs(60))
    }

    #[test]
    fn a_session_stays_even_when_texts_share_nothing() {
        for name in [
            "cache_aware",
            "round_robin",
            "random",
            "least_load",
            "power_of_two",
        ] {
            let s = selector(name);
            let (a, b) = (text("first text"), text("entirely different"));
            let first = s.select(&request(&a, Some("s1")), &candidates(&[0, 0, 0]));
            let again = s.select(&request(&b, Some("s1")), &candidates(&[0, 0, 0]));
            assert_eq!(first.index, again.index, "{name}");
            assert_eq!(again.outcome, Outcome::Session);
        }
    }

    #[test]
    fn an_overloaded_session_backend_is_left() {
        let s = selector("cache_aware");
        let t = text("conversation");
        let first = s.select(&request(&t, Some("s")), &candidates(&[0, 0]));
        let mut loads = [0, 0];
        loads[first.index] = 20;
        let moved = s.select(&request(&t, Some("s")), &candidates(&loads));
        assert_eq!(moved.index, 1 - first.index);
        let back = s.select(&request(&t, Some("s")), &candidates(&[0, 0]));
        assert_eq!((back.index, back.outcome), (moved.index, Outcome::Session));
    }

    #[test]
    fn a_session_whose_backend_is_gone_is_placed_again() {
        let s = selector("least_load");
        let t = text("x");
        let all = candidates(&[0, 0]);
        let first = s.select(&request(&t, Some("s")), &all);
        let rest: Vec<Candidate> = all
            .iter()
            .copied()
            .filter(|c| c.id != all[first.index].id)
            .collect();
        let next = s.select(&request(&t, Some("s")), &rest);
        assert_eq!(next.outcome, Outcome::Balanced);
    }
}
