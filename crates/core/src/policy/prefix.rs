//! What the prefix-tree policies share: a tree per model that remembers which backend got
//! which text, as chains of block hashes ([`blocks`]), and one atomic match-decide-record
//! step per request. Matches reach rules in bytes of text (whole blocks), budgets are in
//! tokens of KV. The decision itself is a [`Rule`]: `cache_aware`, `prefill_aware` and
//! `kv_aware` differ only in theirs.

use super::calibration::Calibration;
use super::{Candidate, Decision, Policy, PolicyParams, Request};
use smallvec::SmallVec;

use crate::BackendId;
use crate::request::blocks::{self, BLOCK_BYTES, KEY_BYTES};
use crate::tree::{Matches, PrefixTrees, TreeStats};

/// What a rule decides on.
pub struct Ask<'a, 'r, 't> {
    /// Per backend, bytes of the text's prefix it was sent.
    pub matches: &'a Matches,
    /// The ready backends (never empty).
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

    /// Forgets what it holds of backends for which `live` is false.
    fn retain(&self, _live: &dyn Fn(BackendId) -> bool) {}

    /// Whether the rule keeps sessions on their backends itself (see [`Policy::keeps_sessions`]).
    fn keeps_sessions(&self) -> bool {
        false
    }
}

/// A policy that routes on prefix matches with rule `R`.
pub struct PrefixPolicy<R> {
    trees: PrefixTrees,
    rule: R,
    /// Each backend's budget ceiling in key bytes (its published capacity), when it differs
    /// from the configured one; the tree's budget is the ceiling times the learned scale.
    ceilings: parking_lot::Mutex<std::collections::HashMap<BackendId, usize>>,
    calibration: Option<Calibration>,
}

impl<R: Rule> PrefixPolicy<R> {
    /// A policy with an empty tree of `params.tree`'s settings.
    pub fn new(params: &PolicyParams, rule: R) -> Self {
        PrefixPolicy {
            trees: PrefixTrees::new(params.tree.clone()),
            rule,
            ceilings: Default::default(),
            calibration: params.calibrate.then(Calibration::default),
        }
    }

    fn apply_budget(&self, backend: BackendId) {
        let ceiling = self.ceilings.lock().get(&backend).copied();
        let ceiling = ceiling.unwrap_or(self.trees.config().max_bytes_per_backend);
        let scale = self.calibration.as_ref().map_or(1.0, |c| c.scale(backend));
        let budget = (ceiling as f64 * scale) as usize;
        self.trees.set_budget(backend, Some(budget));
    }
}

impl<R: Rule> Policy for PrefixPolicy<R> {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        // A backend that did not say how much KV it has is taken to hold what its index
        // may remember: the configured budget is the operator's word for it.
        let text_bytes =
            |b: BackendId| blocks::tokens(self.trees.budget(b)) * crate::TEXT_BYTES_PER_TOKEN;
        let sized: SmallVec<[Candidate; 16]> = (candidates.iter())
            .map(|c| match c.capacity {
                0 => Candidate {
                    capacity: text_bytes(c.id),
                    ..*c
                },
                _ => *c,
            })
            .collect();
        let candidates = &sized[..];
        let mut decision = Decision::new(0, super::Outcome::PrefixMiss);
        let chain = blocks::chain(request.text);
        let total = request.text.len();
        let routed = self
            .trees
            .route(request.model, &[chain.as_flattened()], |keys| {
                let matches = keys.per_block(KEY_BYTES, BLOCK_BYTES, total);
                decision = self.rule.decide(&Ask {
                    matches: &matches,
                    candidates,
                    request,
                });
                candidates.get(decision.index).map(|c| c.id)
            });
        if let Some(routed) = routed {
            self.rule.placed(request, routed.backend);
        }
        decision
    }

    fn record(&self, request: &Request, backend: BackendId) -> usize {
        let chain = blocks::chain(request.text);
        let routed = (self.trees).route(request.model, &[chain.as_flattened()], |_| Some(backend));
        self.rule.placed(request, backend);
        routed.map_or(0, |r| r.matched / KEY_BYTES * BLOCK_BYTES)
    }

    fn maintain(&self, live: &dyn Fn(BackendId) -> bool) -> usize {
        self.trees.retain_backends(live);
        self.rule.retain(live);
        if let Some(c) = &self.calibration {
            c.retain(live);
        }
        self.trees.evict().bytes_removed
    }

    fn needs_upkeep(&self) -> bool {
        self.trees.eviction_due()
    }

    fn tree_stats(&self) -> Option<TreeStats> {
        Some(self.trees.stats())
    }

    fn keeps_sessions(&self) -> bool {
        self.rule.keeps_sessions()
    }

    fn set_budget(&self, backend: BackendId, tokens: Option<usize>) {
        match tokens {
            Some(t) => self.ceilings.lock().insert(backend, blocks::key_bytes(t)),
            None => self.ceilings.lock().remove(&backend),
        };
        self.apply_budget(backend);
    }

    fn budget(&self, backend: BackendId) -> Option<usize> {
        Some(blocks::tokens(self.trees.budget(backend)))
    }

    fn observe(&self, backend: BackendId, predicted: usize, delivered: usize) {
        let learned = self
            .calibration
            .as_ref()
            .and_then(|c| c.observe(backend, predicted, delivered));
        if learned.is_some() {
            self.apply_budget(backend);
        }
    }
}
