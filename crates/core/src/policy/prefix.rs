//! What the prefix policies share: one atomic match-decide-record step per request on the
//! [`PrefixIndex`]. Matches reach a rule as routing text (whole blocks). The decision itself
//! is a [`Rule`]: `cache_aware`, `prefill_aware` and `kv_aware` differ only in theirs.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Candidate, Decision, Outcome, Policy, Request};
use crate::BackendId;
use crate::index::PrefixIndex;
use crate::tree::Matches;
use crate::units::TextBytes;

/// What a rule decides on.
pub struct Ask<'a, 'r, 't> {
    /// Per backend, the routing text of the request's prefix it was sent.
    pub matches: &'a Matches<TextBytes>,
    /// The ready backends (never empty), each with a capacity.
    pub candidates: &'a [Candidate],
    /// The request.
    pub request: &'a Request<'r, 't>,
}

impl Ask<'_, '_, '_> {
    /// What candidate `i` is predicted to reuse of the request: its index match, as its
    /// engine reuses it ([`Candidate::reusable`]).
    pub fn matched(&self, i: usize) -> TextBytes {
        let candidate = &self.candidates[i];
        candidate.reusable(self.matches.matched(candidate.id), self.matches.total())
    }
}

/// Picks a candidate from the prefix matches of a request.
pub trait Rule: Send + Sync {
    /// Decides among the candidates.
    fn decide(&self, ask: &Ask) -> Decision;

    /// Learns that `request` went to `backend` (chosen by this rule or by session
    /// affinity), the index having seen `shared` of its text continued by other texts
    /// ([`Matches::shared`]).
    fn placed(&self, _request: &Request, _backend: BackendId, _shared: TextBytes) {}
}

/// A policy that routes on prefix matches with rule `R`.
pub struct PrefixPolicy<R> {
    index: Arc<PrefixIndex>,
    rule: R,
}

impl<R: Rule> PrefixPolicy<R> {
    /// Rule `rule` over `index`.
    pub fn new(index: &Arc<PrefixIndex>, rule: R) -> Self {
        PrefixPolicy {
            index: Arc::clone(index),
            rule,
        }
    }
}

impl<R: Rule> PrefixPolicy<R> {
    /// `candidate`'s KV in the unit of `request`'s size: tokens as they are in token mode,
    /// routing text at the backend's density in text mode. A backend that did not say how
    /// much KV it has is taken to hold what its index may remember: the configured budget
    /// is the operator's word for it.
    fn capacity(&self, candidate: &Candidate, request: &Request) -> TextBytes {
        match candidate.capacity {
            TextBytes(0) => self.index.reach(candidate.id),
            kv if request.tokens.is_none() => candidate.text_per_token.text(kv.tokens()),
            kv => kv,
        }
    }
}

impl<R: Rule> Policy for PrefixPolicy<R> {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let sized: SmallVec<[Candidate; 16]> = (candidates.iter())
            .map(|c| Candidate {
                capacity: self.capacity(c, request),
                ..*c
            })
            .collect();
        let candidates = &sized[..];
        let (chain, total) = (request.chain(), request.size());
        if request.explain {
            let matches = self.index.matches(request.model, &chain, total);
            return self.rule.decide(&Ask {
                matches: &matches,
                candidates,
                request,
            });
        }
        let mut decision = Decision::new(0, Outcome::PrefixMiss);
        let mut shared = TextBytes(0);
        let routed = self.index.route(request.model, &chain, total, |matches| {
            decision = self.rule.decide(&Ask {
                matches,
                candidates,
                request,
            });
            shared = matches.shared();
            candidates.get(decision.index).map(|c| c.id)
        });
        if let Some(backend) = routed {
            self.rule.placed(request, backend, shared);
        }
        decision
    }

    fn record(&self, request: &Request, backend: BackendId) -> TextBytes {
        let chain = request.chain();
        if request.explain {
            let matches = self.index.matches(request.model, &chain, request.size());
            return matches.matched(backend);
        }
        let matches = (self.index).record(request.model, &chain, request.size(), backend);
        self.rule.placed(request, backend, matches.shared());
        matches.matched(backend)
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::testing::candidates;
    use crate::units::Tokens;

    #[test]
    fn an_engine_reuses_whole_blocks_of_its_own_size_never_the_last_token() {
        let mut candidate = candidates(&[0])[0];
        let tokens = |n: usize| Tokens(n).text();
        // Unknown block: the index's own match.
        assert_eq!(candidate.reusable(tokens(528), tokens(533)), tokens(528));
        // vLLM's CPU build, 32-token blocks: 528 matched of 533 is 16 blocks.
        candidate.block = Tokens(32);
        assert_eq!(candidate.reusable(tokens(528), tokens(533)), tokens(512));
        // A prompt held whole is computed from its last block on.
        assert_eq!(candidate.reusable(tokens(64), tokens(64)), tokens(32));
        assert_eq!(candidate.reusable(tokens(64), tokens(65)), tokens(64));
        assert_eq!(candidate.reusable(tokens(31), tokens(100)), tokens(0));
    }
}
