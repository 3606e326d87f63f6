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

/// Picks a candidate from the prefix matches of a request.
pub trait Rule: Send + Sync {
    /// Decides among the candidates.
    fn decide(&self, ask: &Ask) -> Decision;

    /// Learns that `request` went to `backend` (chosen by this rule or by session affinity).
    fn placed(&self, _request: &Request, _backend: BackendId) {}
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

impl<R: Rule> Policy for PrefixPolicy<R> {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        // A backend that did not say how much KV it has is taken to hold what its index
        // may remember: the configured budget is the operator's word for it.
        let sized: SmallVec<[Candidate; 16]> = (candidates.iter())
            .map(|c| match c.capacity {
                TextBytes(0) => Candidate {
                    capacity: self.index.reach(c.id),
                    ..*c
                },
                _ => *c,
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
        let routed = self.index.route(request.model, &chain, total, |matches| {
            decision = self.rule.decide(&Ask {
                matches,
                candidates,
                request,
            });
            candidates.get(decision.index).map(|c| c.id)
        });
        if let Some(backend) = routed {
            self.rule.placed(request, backend);
        }
        decision
    }

    fn record(&self, request: &Request, backend: BackendId) -> TextBytes {
        let chain = request.chain();
        if request.explain {
            let matches = self.index.matches(request.model, &chain, request.size());
            return matches.matched(backend);
        }
        let matched = self.index.record(request.model, &chain, backend);
        self.rule.placed(request, backend);
        matched
    }
}
