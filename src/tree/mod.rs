//! TEMPORARY naive stand-in for the sharded radix tree (being written); same API.

use parking_lot::Mutex;

use crate::BackendId;

/// Tree settings.
#[derive(Clone, Debug)]
pub struct TreeConfig {
    /// Max bytes per backend.
    pub max_bytes_per_backend: usize,
    /// Shards.
    pub shards: usize,
    /// Shard key bytes.
    pub shard_key_bytes: usize,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig { max_bytes_per_backend: 16 << 20, shards: 32, shard_key_bytes: 64 }
    }
}

/// Matches.
#[derive(Debug, Default)]
pub struct Matches {
    total: usize,
    entries: Vec<(BackendId, usize)>,
}

impl Matches {
    pub fn total(&self) -> usize { self.total }
    pub fn matched(&self, id: BackendId) -> usize {
        self.entries.iter().find(|e| e.0 == id).map_or(0, |e| e.1)
    }
    pub fn iter(&self) -> impl Iterator<Item = (BackendId, usize)> + '_ { self.entries.iter().copied() }
    pub fn best(&self) -> usize { self.entries.iter().map(|e| e.1).max().unwrap_or(0) }
}

/// Routed.
pub struct Routed { pub backend: BackendId, pub matched: usize, pub total: usize }

/// Stats.
#[derive(Debug, Default, Clone)]
pub struct TreeStats {
    pub models: Vec<(String, usize, usize)>,
    pub backends: Vec<(BackendId, usize)>,
}

/// Evict report.
#[derive(Debug, Default)]
pub struct EvictReport { pub bytes: usize, pub nodes: usize }

/// Trees.
pub struct PrefixTrees {
    entries: Mutex<Vec<(Vec<u8>, Vec<u8>, BackendId)>>,
}

fn concat<P: AsRef<[u8]>>(text: &[P]) -> Vec<u8> {
    text.iter().flat_map(|p| p.as_ref().iter().copied()).collect()
}

impl PrefixTrees {
    pub fn new(_config: TreeConfig) -> Self { PrefixTrees { entries: Mutex::new(Vec::new()) } }
    pub fn route<P: AsRef<[u8]>>(&self, model: &[u8], text: &[P], choose: impl FnOnce(&Matches) -> Option<BackendId>) -> Option<Routed> {
        let m = self.matches(model, text);
        let backend = choose(&m)?;
        self.insert(model, text, backend);
        Some(Routed { backend, matched: m.matched(backend), total: m.total })
    }
    pub fn insert<P: AsRef<[u8]>>(&self, model: &[u8], text: &[P], backend: BackendId) {
        self.entries.lock().push((model.to_vec(), concat(text), backend));
    }
    pub fn matches<P: AsRef<[u8]>>(&self, model: &[u8], text: &[P]) -> Matches {
        let t = concat(text);
        let mut m = Matches { total: t.len(), entries: Vec::new() };
        for (em, et, b) in self.entries.lock().iter() {
            if em.as_slice() != model { continue; }
            let l = et.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if l == 0 { continue; }
            match m.entries.iter_mut().find(|e| e.0 == *b) {
                Some(e) => e.1 = e.1.max(l),
                None => m.entries.push((*b, l)),
            }
        }
        m
    }
    pub fn evict(&self) -> EvictReport { EvictReport::default() }
    pub fn over_budget(&self) -> bool { false }
    pub fn retain_backends(&self, keep: impl Fn(BackendId) -> bool) { self.entries.lock().retain(|e| keep(e.2)); }
    pub fn stats(&self) -> TreeStats { TreeStats::default() }
}
