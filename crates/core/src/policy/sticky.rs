//! Session affinity as a wrapper around a policy, as Pingora's `Weighted<H>` wraps a
//! selection: a request with a session key goes to the backend that last served the
//! session while that backend is ready and not past the imbalance bound; otherwise the
//! wrapped policy places it and the session follows. Policies that weigh sessions
//! themselves (`kv_aware`) are simply not wrapped.

use std::sync::Arc;

use super::{
    Candidate, Decision, Outcome, Policy, PolicyParams, Request, Sessions, SharedTunables,
    overloaded,
};
use crate::BackendId;
use crate::units::TextBytes;

/// `P` with session affinity.
pub struct Sticky<P> {
    inner: P,
    sessions: Arc<Sessions>,
    tunables: SharedTunables,
}

impl<P: Policy> Sticky<P> {
    /// `inner` with sessions that expire after `params.session_ttl` idle on its clock.
    pub fn new(inner: P, params: &PolicyParams) -> Self {
        let sessions = Sessions::new(
            params.session_ttl,
            super::sessions::MAX_SESSIONS,
            Arc::clone(&params.clock),
        );
        Sticky {
            inner,
            sessions: Arc::new(sessions),
            tunables: params.tunables.clone(),
        }
    }

    /// The session table, for upkeep and stats.
    pub fn sessions(&self) -> Arc<Sessions> {
        Arc::clone(&self.sessions)
    }

    fn by_session(&self, request: &Request, candidates: &[Candidate]) -> Option<Decision> {
        let key = request.session?;
        let backend = self.sessions.get(key)?;
        let index = candidates.iter().position(|c| c.id == backend)?;
        let balance = self.tunables.get().balance;
        if overloaded(candidates[index].load, candidates, &balance) {
            return None;
        }
        let matched = self.inner.record(request, backend);
        if !request.explain {
            self.sessions.set(key, backend);
        }
        Some(Decision {
            index,
            outcome: Outcome::Session,
            matched,
            home: Some(index),
        })
    }
}

impl<P: Policy> Policy for Sticky<P> {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        if let Some(decision) = self.by_session(request, candidates) {
            return decision;
        }
        let decision = self.inner.choose(request, candidates);
        if let Some(key) = request.session.filter(|_| !request.explain) {
            self.sessions.set(key, candidates[decision.index].id);
        }
        decision
    }

    fn record(&self, request: &Request, backend: BackendId) -> TextBytes {
        self.inner.record(request, backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;
    use crate::policy::{Selector, choose};

    fn selector(name: &str) -> Selector {
        choose(name).unwrap().build(&params(0.3, 4))
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

    #[test]
    fn only_wrapped_policies_keep_a_session_table() {
        let names = |s: &Selector| s.tables().iter().map(|t| t.name).collect::<Vec<_>>();
        assert_eq!(names(&selector("cache_aware")), ["sessions"]);
        assert_eq!(names(&selector("kv_aware")), ["conversations"]);
    }
}
