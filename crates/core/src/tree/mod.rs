//! Which backend already holds a text's prefix: sharded radix trees per model.
//!
//! [`PrefixTrees`] remembers, for each model, which backends were sent which
//! text and when (a logical clock), so the router can send a request where
//! its prompt prefix is most likely still in the KV cache. Texts are given as
//! slices of parts (borrowed pieces of the request body) and are never joined
//! on the match path; only bytes that become new tree nodes are copied.
//!
//! Each model has its own tree, split into shards chosen by a hash of the
//! text's leading bytes, each behind its own mutex; one [`PrefixTrees::route`]
//! takes exactly one shard lock. Memory is bounded by a per-backend byte
//! budget enforced by [`PrefixTrees::evict`] (least recently used first).
//!
//! This module is not a policy: it knows nothing of HTTP, load or health; the
//! caller's `choose` closure decides. It does not track what a backend really
//! keeps in its cache, only what it was sent.

#[cfg(test)]
mod block_props;
#[cfg(test)]
mod check;
mod evict;
#[cfg(test)]
mod prop_tests;
mod radix;
#[cfg(test)]
mod tests;
mod text;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use crate::BackendId;
use crate::units::{KeyBytes, TextBytes};
pub use evict::EvictReport;
use radix::{Entry, Radix};
use text::Cursor;

/// Sizing of the trees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeConfig {
    /// Key bytes per backend at most (sum of edge lengths of nodes the backend is on),
    /// across all models. Default 512 KiB: a million tokens' worth of block hashes.
    pub budget: KeyBytes,
    /// Number of lock shards per model tree (0 is taken as 1). Default 32.
    pub shards: usize,
    /// Leading bytes of the key that choose its shard. Default 8: the first block's hash
    /// (keys are chains of 8-byte block hashes, see `request::blocks`).
    pub shard_key_bytes: usize,
    /// Continuations that make a prefix hot (see [`Matches::hot`]). Default 16.
    pub hot_children: usize,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            budget: KeyBytes(512 << 10),
            shards: 32,
            shard_key_bytes: 8,
            hot_children: 16,
        }
    }
}

/// Per-backend matched prefix lengths for one text, in bytes of the tree's keys (`usize`)
/// or, once converted by [`Matches::text`], of routing text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matches<U = usize> {
    /// Length of the whole text.
    total: U,
    /// Length of the longest matched prefix that texts recorded earlier continue in more
    /// than one way (a branching point of the tree).
    shared: U,
    /// Like `shared`, for prefixes continued in at least `hot_children` ways.
    hot: U,
    /// (backend, matched length > 0), sorted by backend.
    per_backend: SmallVec<[(BackendId, U); 8]>,
}

impl Matches {
    /// No match yet for a text of `total` bytes.
    fn empty(total: usize) -> Self {
        Matches {
            total,
            shared: 0,
            hot: 0,
            per_backend: SmallVec::new(),
        }
    }

    /// Note that every backend of `entries` (sorted by backend) matched
    /// `depth` bytes. Deeper nodes come later in a walk, so the last note is
    /// the deepest; a merge of two sorted lists keeps this linear.
    fn note(&mut self, entries: &[Entry], depth: usize) {
        let mut i = 0;
        for e in entries {
            while self.per_backend.get(i).is_some_and(|&(b, _)| b < e.backend) {
                i += 1;
            }
            match self.per_backend.get_mut(i) {
                Some(slot) if slot.0 == e.backend => slot.1 = depth,
                _ => self.per_backend.insert(i, (e.backend, depth)),
            }
            i += 1;
        }
    }

    /// These matches, made over keys of block hashes, as routing text (whole blocks) of a
    /// text of `total` bytes.
    pub fn text(&self, total: TextBytes) -> Matches<TextBytes> {
        let text = |depth: usize| KeyBytes(depth).text();
        Matches {
            total,
            shared: text(self.shared),
            hot: text(self.hot),
            per_backend: (self.per_backend.iter())
                .map(|&(b, m)| (b, text(m)))
                .collect(),
        }
    }
}

impl<U: Copy + Ord + Default> Matches<U> {
    /// No match, for a text of length `total`.
    pub fn none(total: U) -> Self {
        Matches {
            total,
            shared: U::default(),
            hot: U::default(),
            per_backend: SmallVec::new(),
        }
    }

    /// Length of the whole text.
    pub fn total(&self) -> U {
        self.total
    }

    /// Length of the text's prefix that `id` was sent; 0 if none.
    pub fn matched(&self, id: BackendId) -> U {
        self.per_backend
            .binary_search_by_key(&id, |&(b, _)| b)
            .map_or(U::default(), |i| self.per_backend[i].1)
    }

    /// (backend, matched length) for each backend with a match, by backend id.
    pub fn iter(&self) -> impl Iterator<Item = (BackendId, U)> + '_ {
        self.per_backend.iter().copied()
    }

    /// Length of the longest prefix of the text that earlier texts continue in more than
    /// one way: a prefix shared by several conversations (a system prompt, a template), as
    /// opposed to one conversation's own history below it.
    pub fn shared(&self) -> U {
        self.shared
    }

    /// Length of the longest prefix of the text that earlier texts continue in at least
    /// [`TreeConfig::hot_children`] ways: a prefix so much in demand that every backend
    /// will soon hold it anyway.
    pub fn hot(&self) -> U {
        self.hot
    }

    /// The longest match over all backends; 0 if none.
    pub fn best(&self) -> U {
        self.per_backend
            .iter()
            .map(|&(_, m)| m)
            .max()
            .unwrap_or_default()
    }
}

/// What [`PrefixTrees::route`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    /// The backend `choose` picked; the text is now recorded under it.
    pub backend: BackendId,
    /// Bytes of the text's prefix it had been sent before, bytes.
    pub matched: usize,
    /// Length of the whole text, bytes.
    pub total: usize,
}

/// Figures for one model's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStats {
    /// Model name (lossy UTF-8).
    pub model: String,
    /// Key bytes stored (sum of edge lengths over all shards).
    pub bytes: usize,
    /// Nodes, roots excluded.
    pub nodes: usize,
    /// Bytes the tree holds on the heap: node slots (live and free), edges, spilled child
    /// and backend lists, free lists (allocator overhead excluded).
    pub heap: usize,
}

/// Figures for stats, see [`PrefixTrees::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// One entry per model, sorted by name.
    pub models: Vec<ModelStats>,
    /// Per backend, bytes counted against its budget (across models), by id.
    pub backends: Vec<(BackendId, usize)>,
}

/// One model's tree: its shards.
struct ModelTree {
    shards: Box<[Mutex<Radix>]>,
}

impl ModelTree {
    fn new(shards: usize) -> Self {
        ModelTree {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// The shard with index `i` (taken modulo the shard count).
    fn shard(&self, i: usize) -> &Mutex<Radix> {
        &self.shards[i % self.shards.len()]
    }
}

type ModelMap = HashMap<Box<[u8]>, Arc<ModelTree>>;

/// One sharded radix tree per model. `Send + Sync`; share it behind an `Arc`.
///
/// Locking: routes take the model map's read lock, then one shard mutex.
/// Maintenance (`evict`, `retain_backends`, `stats`, `over_budget`) takes one
/// shard mutex at a time, and the map's write lock only to add a model or to
/// drop empty ones.
pub struct PrefixTrees {
    config: TreeConfig,
    /// Budgets that differ from the configured one, by backend (sized from its KV).
    budgets: RwLock<HashMap<BackendId, usize>>,
    /// The smallest budget of any backend, bytes.
    smallest: AtomicUsize,
    models: RwLock<ModelMap>,
    /// Logical clock: one tick per recorded route or insert.
    clock: AtomicU64,
    /// Budget bytes recorded since the last eviction, summed over backends.
    grown: AtomicUsize,
}

impl PrefixTrees {
    /// Empty trees sized by `config`.
    pub fn new(config: TreeConfig) -> Self {
        PrefixTrees {
            smallest: AtomicUsize::new(config.budget.0),
            config,
            budgets: RwLock::new(HashMap::new()),
            models: RwLock::new(HashMap::new()),
            clock: AtomicU64::new(1),
            grown: AtomicUsize::new(0),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    /// Match `text` in `model`'s tree, let `choose` pick a backend from the matches (it may return
    /// None: then nothing is recorded), record the whole text under the chosen backend, all under
    /// ONE acquisition of one shard lock. `choose` is cheap and must not call back into the tree.
    ///
    /// For a model never seen before `choose` sees no matches, and the model's tree is created
    /// only if it picks a backend. Returns `None` when `choose` returned `None`.
    pub fn route<P: AsRef<[u8]>>(
        &self,
        model: &[u8],
        text: &[P],
        choose: impl FnOnce(&Matches) -> Option<BackendId>,
    ) -> Option<Routed> {
        let total = text::total_len(text);
        let shard = self.shard_index(text, total);
        match RwLockReadGuard::try_map(self.models.read(), |m| m.get(model)) {
            Ok(tree) => return self.route_in(&tree, shard, text, total, choose),
            Err(map) => drop(map),
        }
        // Unknown model: create its tree only once a backend was chosen.
        let backend = choose(&Matches::empty(total))?;
        let tree = self.model_or_create(model)?;
        self.route_in(&tree, shard, text, total, |_| Some(backend))
    }

    /// [`Self::route`] in a given model's tree.
    fn route_in<P: AsRef<[u8]>>(
        &self,
        tree: &ModelTree,
        shard: usize,
        text: &[P],
        total: usize,
        choose: impl FnOnce(&Matches) -> Option<BackendId>,
    ) -> Option<Routed> {
        let mut radix = tree.shard(shard).lock();
        let mut cur = Cursor::new(text, total);
        let mut matches = Matches::empty(total);
        let walk = radix.walk(&mut cur, &mut matches, self.config.hot_children);
        let backend = choose(&matches)?;
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        radix.record(&walk, &cur, backend, tick);
        let matched = matches.matched(backend);
        self.grown
            .fetch_add(total.saturating_sub(matched), Ordering::Relaxed);
        Some(Routed {
            backend,
            matched,
            total,
        })
    }

    /// Record `text` under `backend` without choosing (used when a session decided the backend).
    pub fn insert<P: AsRef<[u8]>>(&self, model: &[u8], text: &[P], backend: BackendId) {
        self.route(model, text, |_| Some(backend));
    }

    /// Match only (no recording); for tests, stats and debugging.
    pub fn matches<P: AsRef<[u8]>>(&self, model: &[u8], text: &[P]) -> Matches {
        let total = text::total_len(text);
        let mut matches = Matches::empty(total);
        let models = self.models.read();
        if let Some(tree) = models.get(model) {
            let radix = tree.shard(self.shard_index(text, total)).lock();
            radix.walk(
                &mut Cursor::new(text, total),
                &mut matches,
                self.config.hot_children,
            );
        }
        matches
    }

    /// Sets `backend`'s budget (`None`: the configured one). The next eviction brings it
    /// down to a smaller one.
    pub fn set_budget(&self, backend: BackendId, budget: Option<KeyBytes>) {
        let mut budgets = self.budgets.write();
        match budget.filter(|&b| b != self.config.budget) {
            Some(b) => budgets.insert(backend, b.0.max(1)),
            None => budgets.remove(&backend),
        };
        let smallest = budgets.values().copied().min().unwrap_or(usize::MAX);
        let smallest = smallest.min(self.config.budget.0);
        self.smallest.store(smallest, Ordering::Relaxed);
    }

    /// `backend`'s budget.
    pub fn budget(&self, backend: BackendId) -> KeyBytes {
        KeyBytes(self.budget_bytes(backend))
    }

    /// `backend`'s budget, key bytes.
    fn budget_bytes(&self, backend: BackendId) -> usize {
        let budgets = self.budgets.read();
        budgets
            .get(&backend)
            .copied()
            .unwrap_or(self.config.budget.0)
    }

    /// True when the text recorded since the last eviction could have put a backend 10%
    /// over its budget: time to call [`Self::evict`]. One atomic load, for the request path.
    pub fn eviction_due(&self) -> bool {
        self.grown.load(Ordering::Relaxed) > self.smallest.load(Ordering::Relaxed) / 10
    }

    /// True when any backend is over 110% of its budget. Cheap: reads the
    /// per-shard counters (one short lock per shard), no tree walk.
    pub fn over_budget(&self) -> bool {
        let over = |b: BackendId, used: usize| {
            let limit = self.budget_bytes(b);
            used > limit.saturating_add(limit / 10)
        };
        self.usage_totals().iter().any(|&(b, used)| over(b, used))
    }

    /// Figures for stats: per model (name, text bytes stored, node count) and per backend bytes.
    pub fn stats(&self) -> TreeStats {
        let named: Vec<(Box<[u8]>, Arc<ModelTree>)> = (self.models.read().iter())
            .map(|(name, tree)| (name.clone(), Arc::clone(tree)))
            .collect();
        let mut out: Vec<ModelStats> = named
            .iter()
            .map(|(name, tree)| model_stats(name, tree))
            .collect();
        out.sort_by(|a, b| a.model.cmp(&b.model));
        TreeStats {
            models: out,
            backends: self.usage_totals(),
        }
    }

    /// Shard index of a text of `total` bytes.
    fn shard_index<P: AsRef<[u8]>>(&self, text: &[P], total: usize) -> usize {
        let shards = self.config.shards.max(1);
        text::shard_of(text, total, self.config.shard_key_bytes, shards)
    }

    /// `model`'s tree, created if missing, behind a read lock on the map.
    fn model_or_create(&self, model: &[u8]) -> Option<MappedRwLockReadGuard<'_, Arc<ModelTree>>> {
        let mut map = self.models.write();
        map.entry(model.into())
            .or_insert_with(|| Arc::new(ModelTree::new(self.config.shards)));
        let map = RwLockWriteGuard::downgrade(map);
        RwLockReadGuard::try_map(map, |m| m.get(model)).ok()
    }

    /// Every model's tree, without holding the map lock afterwards.
    fn trees(&self) -> Vec<Arc<ModelTree>> {
        self.models.read().values().cloned().collect()
    }

    /// Per backend, bytes used across all models and shards, by id. Locks
    /// one shard at a time.
    fn usage_totals(&self) -> Vec<(BackendId, usize)> {
        let mut totals: Vec<(BackendId, usize)> = Vec::new();
        for tree in self.trees() {
            for shard in tree.shards.iter() {
                for &(b, used) in &shard.lock().usage {
                    add_to(&mut totals, b, used);
                }
            }
        }
        totals
    }
}

/// Add `n` to `b`'s entry in a list sorted by backend.
fn add_to(list: &mut Vec<(BackendId, usize)>, b: BackendId, n: usize) {
    match list.binary_search_by_key(&b, |&(id, _)| id) {
        Ok(i) => list[i].1 += n,
        Err(i) => list.insert(i, (b, n)),
    }
}

/// Figures of one model's tree, locking one shard at a time.
fn model_stats(name: &[u8], tree: &ModelTree) -> ModelStats {
    let (mut bytes, mut nodes, mut heap) = (0, 0, 0);
    for shard in tree.shards.iter() {
        let radix = shard.lock();
        bytes += radix.bytes;
        nodes += radix.live;
        heap += radix.heap_bytes();
    }
    ModelStats {
        model: String::from_utf8_lossy(name).into_owned(),
        bytes,
        nodes,
        heap,
    }
}
