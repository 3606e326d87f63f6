//! The prefix index: which backend was sent which prefix, as chains of block hashes
//! ([`blocks`](crate::request::blocks)) in one sharded tree per model
//! ([`tree`](crate::tree)), each backend's share bounded by a budget sized like its KV
//! cache. A handle of its own: prefix policies match and record through it; upkeep evicts
//! it and sizes its budgets from the capacities backends publish; responses correct those
//! budgets (its `calibration` module); stats read it.
//!
//! Not a policy: it knows nothing of load, health or sessions.

mod calibration;

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::BackendId;
use crate::tree::{Matches, PrefixTrees, TreeConfig, TreeStats};
use crate::units::{KeyBytes, TextBytes, Tokens};
use calibration::Calibration;

/// The index, shared (`Arc`) by the policy that routes on it and by upkeep and stats.
pub struct PrefixIndex {
    trees: PrefixTrees,
    /// Each backend's budget ceiling (its published capacity), when it differs from the
    /// configured one; its tree budget is the ceiling times the learned scale.
    ceilings: Mutex<HashMap<BackendId, KeyBytes>>,
    calibration: Option<Calibration>,
}

impl PrefixIndex {
    /// An empty index of `tree`'s settings; `calibrate`: budgets learn from reported
    /// cached tokens.
    pub fn new(tree: TreeConfig, calibrate: bool) -> Self {
        PrefixIndex {
            trees: PrefixTrees::new(tree),
            ceilings: Mutex::default(),
            calibration: calibrate.then(Calibration::default),
        }
    }

    /// Matches `chain` (a prompt's blocks, [`Request::chain`]) in `model`'s tree, lets
    /// `decide` pick a backend from the matches (in routing text, whole blocks, of a prompt
    /// of `total`), and records the chain under it, in one step under one shard lock.
    /// `decide` must not call back into the index. Returns the backend picked.
    ///
    /// [`Request::chain`]: crate::policy::Request::chain
    pub fn route(
        &self,
        model: &[u8],
        chain: &[[u8; 8]],
        total: TextBytes,
        decide: impl FnOnce(&Matches<TextBytes>) -> Option<BackendId>,
    ) -> Option<BackendId> {
        let routed = (self.trees).route(model, &[chain.as_flattened()], |keys| {
            decide(&keys.text(total))
        });
        routed.map(|r| r.backend)
    }

    /// The matches of `chain` in `model`'s tree, recording nothing.
    pub fn matches(&self, model: &[u8], chain: &[[u8; 8]], total: TextBytes) -> Matches<TextBytes> {
        (self.trees)
            .matches(model, &[chain.as_flattened()])
            .text(total)
    }

    /// Records `chain` (of a text of `total` bytes) under `backend`, chosen by someone else;
    /// returns the matches it had before.
    pub fn record(
        &self,
        model: &[u8],
        chain: &[[u8; 8]],
        total: TextBytes,
        backend: BackendId,
    ) -> Matches<TextBytes> {
        let mut before = None;
        (self.trees).route(model, &[chain.as_flattened()], |keys| {
            before = Some(keys.text(total));
            Some(backend)
        });
        before.unwrap_or_else(|| Matches::none(total))
    }

    /// The most `backend` may hold as the index sees it: its budget, in routing text.
    pub fn reach(&self, backend: BackendId) -> TextBytes {
        self.trees.budget(backend).tokens().text()
    }

    /// Sizes `backend`'s budget to `capacity`, its KV as routing text (what it published,
    /// at its density), or back to the configured budget (`None`).
    pub fn set_capacity(&self, backend: BackendId, capacity: Option<TextBytes>) {
        match capacity {
            Some(t) => self.ceilings.lock().insert(backend, t.keys()),
            None => self.ceilings.lock().remove(&backend),
        };
        self.apply_budget(backend);
    }

    /// `backend`'s budget, tokens of KV.
    pub fn budget(&self, backend: BackendId) -> Tokens {
        self.trees.budget(backend).tokens()
    }

    /// Learns from a response: `backend` reported cached tokens standing for `delivered`
    /// routing text where the index predicted it held `predicted` of the request's text.
    pub fn observe(&self, backend: BackendId, predicted: TextBytes, delivered: TextBytes) {
        let Some(calibration) = &self.calibration else {
            return;
        };
        if calibration.observe(backend, predicted, delivered).is_some() {
            self.apply_budget(backend);
        }
    }

    /// Forgets the backends for which `live` is false, then evicts down to every budget.
    /// Returns the key bytes evicted.
    pub fn maintain(&self, live: &dyn Fn(BackendId) -> bool) -> KeyBytes {
        self.trees.retain_backends(live);
        if let Some(c) = &self.calibration {
            c.retain(live);
        }
        self.trim()
    }

    /// Evicts down to every budget; returns the key bytes evicted.
    pub fn trim(&self) -> KeyBytes {
        KeyBytes(self.trees.evict().bytes_removed)
    }

    /// Whether enough was recorded since the last eviction to put a backend over its
    /// budget. One atomic load: asked after every decision.
    pub fn eviction_due(&self) -> bool {
        self.trees.eviction_due()
    }

    /// Figures for stats.
    pub fn stats(&self) -> TreeStats {
        self.trees.stats()
    }

    fn apply_budget(&self, backend: BackendId) {
        let ceiling = self.ceilings.lock().get(&backend).copied();
        let ceiling = ceiling.unwrap_or(self.trees.config().budget);
        let scale = self.calibration.as_ref().map_or(1.0, |c| c.scale(backend));
        let budget = KeyBytes((ceiling.0 as f64 * scale) as usize);
        self.trees.set_budget(backend, Some(budget));
    }
}
