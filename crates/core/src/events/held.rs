//! What one engine holds, as its events said: its blocks keyed by the router's own chained
//! hash of their token ids ([`Chainer`] over the ids as 4-byte little-endian words, the
//! same chain token mode computes for a prompt, in 16-token steps: an engine block of 32
//! tokens is keyed by the hash that ends it), so the engine's hash algorithm and
//! `PYTHONHASHSEED` do not matter. The engine's own hashes are kept only to follow its
//! `parent_block_hash` links and to apply its removals. Bounded: past `max_blocks` the
//! record is no longer whole, and says so.

use std::collections::HashMap;

use super::decode::{EngineHash, Event, Medium, Stored};
use crate::request::blocks::Chainer;

/// Tokens per hash of the router's chain (a 64-byte block of 4-byte ids).
pub(crate) const BLOCK_TOKENS: usize = 16;

/// One block the engine holds: the router's key of it, and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    key: [u8; 8],
    medium: Medium,
}

/// Whether a record can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whole {
    /// Every event since the record started (or was cleared) was applied.
    Yes,
    /// Some were not (a store whose parent is unknown, a store past the bound): matches
    /// may miss blocks the engine holds.
    No,
}

/// One engine's blocks.
pub struct Held {
    /// Tokens per block: the engine's, taken from its first store into an empty record;
    /// later stores of another size are another cache group's, not this record's.
    block_size: usize,
    /// The KV cache group followed (of a hybrid model): the first store's, taken like
    /// `block_size`; stores and removals of other groups are not this record's.
    group: Option<u64>,
    /// Blocks at most.
    max_blocks: usize,
    /// By the engine's hash.
    by_engine: HashMap<EngineHash, Block>,
    /// How many of the engine's blocks (GPU, CPU) carry each key.
    by_key: HashMap<[u8; 8], (u32, u32)>,
    /// Blocks on GPU, and elsewhere.
    on_gpu: usize,
    whole: Whole,
}

impl Held {
    /// An empty record for blocks of `block_size` tokens, at most `max_blocks` of them;
    /// `None` unless `block_size` is a multiple of the chain's 16 tokens.
    pub fn new(block_size: usize, max_blocks: usize) -> Option<Self> {
        (block_size > 0 && block_size.is_multiple_of(BLOCK_TOKENS)).then(|| Held {
            block_size,
            group: None,
            max_blocks,
            by_engine: HashMap::new(),
            by_key: HashMap::new(),
            on_gpu: 0,
            whole: Whole::Yes,
        })
    }

    /// Bounds the record to `max_blocks` from now on (blocks past it are not dropped; new
    /// ones are refused, and the record is then not whole).
    pub fn set_max_blocks(&mut self, max_blocks: usize) {
        self.max_blocks = max_blocks;
    }

    /// Tokens per block (the engine's, once it stored).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.by_engine.len()
    }

    /// Blocks held on GPU, and elsewhere (CPU, other tiers).
    pub fn by_medium(&self) -> (usize, usize) {
        (self.on_gpu, self.by_engine.len() - self.on_gpu)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.by_engine.is_empty()
    }

    /// Whether every event was applied.
    pub fn whole(&self) -> Whole {
        self.whole
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Stored(stored) => self.store(stored),
            Event::Removed(removed) if removed.group.is_none() || removed.group == self.group => {
                for hash in &removed.hashes {
                    self.remove(*hash);
                }
            }
            Event::Removed(_) => {}
            Event::Cleared => self.clear(),
            Event::Unknown(_) => {}
        }
    }

    /// Forgets everything (the engine restarted or cleared its cache).
    pub fn clear(&mut self) {
        self.by_engine.clear();
        self.by_key.clear();
        self.on_gpu = 0;
        self.whole = Whole::Yes;
    }

    /// How many of a prompt's leading tokens the engine holds, on GPU and on GPU or CPU,
    /// given the prompt's `chain` (one hash per 16 tokens).
    pub fn matched(&self, chain: &[[u8; 8]]) -> (usize, usize) {
        let step = self.block_size / BLOCK_TOKENS;
        let ends = chain.iter().skip(step - 1).step_by(step);
        let held = |k: &[u8; 8]| self.by_key.get(k).copied().unwrap_or((0, 0));
        let gpu = ends.clone().take_while(|k| held(k).0 > 0).count();
        let any = ends.take_while(|k| held(k) != (0, 0)).count();
        (gpu * self.block_size, any * self.block_size)
    }

    fn store(&mut self, stored: &Stored) {
        let size = stored.block_size;
        if self.is_empty() && size > 0 && size.is_multiple_of(BLOCK_TOKENS) {
            self.block_size = size;
            self.group = stored.group;
        }
        if stored.keyed || size != self.block_size || stored.group != self.group {
            return; // an adapter's, a salted or another group's block: never a plain prompt's
        }
        let mut chainer = match stored.parent {
            None => Chainer::default(),
            Some(parent) => match self.by_engine.get(&parent) {
                Some(block) => Chainer::resume(block.key),
                None => {
                    self.whole = Whole::No;
                    return;
                }
            },
        };
        let mut keys = Vec::with_capacity(stored.hashes.len());
        let mut hashes = Vec::new();
        for ids in stored.token_ids.chunks_exact(self.block_size) {
            let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
            chainer.push(&bytes, &mut hashes);
            keys.extend(hashes.last().copied());
        }
        for (hash, key) in stored.hashes.iter().zip(keys) {
            if self.by_engine.len() >= self.max_blocks && !self.by_engine.contains_key(hash) {
                self.whole = Whole::No;
                return;
            }
            let block = Block {
                key,
                medium: stored.medium,
            };
            if let Some(old) = self.by_engine.insert(*hash, block) {
                self.unkey(old);
            }
            let counts = self.by_key.entry(key).or_default();
            match stored.medium {
                Medium::Gpu => counts.0 += 1,
                _ => counts.1 += 1,
            }
            self.on_gpu += usize::from(stored.medium == Medium::Gpu);
        }
    }

    fn remove(&mut self, hash: EngineHash) {
        if let Some(block) = self.by_engine.remove(&hash) {
            self.unkey(block);
        }
    }

    fn unkey(&mut self, block: Block) {
        self.on_gpu -= usize::from(block.medium == Medium::Gpu);
        let Some(counts) = self.by_key.get_mut(&block.key) else {
            return;
        };
        match block.medium {
            Medium::Gpu => counts.0 = counts.0.saturating_sub(1),
            _ => counts.1 = counts.1.saturating_sub(1),
        }
        if *counts == (0, 0) {
            self.by_key.remove(&block.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode::Removed;

    fn ids(blocks: usize, from: u32) -> Vec<u32> {
        (0..blocks as u32 * 16).map(|i| i + from).collect()
    }

    /// The router's chain of a prompt of `ids` (as token mode makes it).
    fn chain(ids: &[u32]) -> Vec<[u8; 8]> {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let mut chain = Vec::new();
        Chainer::default().push(&bytes, &mut chain);
        chain
    }

    fn stored(hashes: &[u64], parent: Option<u64>, token_ids: Vec<u32>, medium: Medium) -> Event {
        Event::Stored(Stored {
            hashes: hashes.to_vec(),
            parent,
            token_ids,
            block_size: 16,
            medium,
            keyed: false,
            group: None,
        })
    }

    #[test]
    fn a_prompt_matches_the_run_of_its_leading_blocks_the_engine_stored() {
        let mut held = Held::new(16, 1000).unwrap();
        let prompt = ids(4, 0);
        // Stored in two events, the second linked to the first by the engine's hash.
        held.apply(&stored(&[11, 12], None, prompt[..32].to_vec(), Medium::Gpu));
        held.apply(&stored(
            &[13],
            Some(12),
            prompt[32..48].to_vec(),
            Medium::Gpu,
        ));
        assert_eq!(held.matched(&chain(&prompt)), (48, 48));
        held.apply(&Event::Removed(Removed {
            hashes: vec![12],
            medium: Medium::Gpu,
            group: None,
        }));
        assert_eq!(
            held.matched(&chain(&prompt)),
            (16, 16),
            "a gap ends the run"
        );
        assert_eq!(held.matched(&chain(&ids(4, 1))), (0, 0));
        held.apply(&Event::Cleared);
        assert!(held.is_empty());
        assert_eq!(held.whole(), Whole::Yes);
    }

    #[test]
    fn cpu_blocks_count_apart_and_unknown_parents_make_the_record_partial() {
        let mut held = Held::new(16, 1000).unwrap();
        let prompt = ids(2, 0);
        held.apply(&stored(&[1], None, prompt[..16].to_vec(), Medium::Gpu));
        held.apply(&stored(&[2], Some(1), prompt[16..].to_vec(), Medium::Cpu));
        assert_eq!(held.matched(&chain(&prompt)), (16, 32));
        assert_eq!(held.by_medium(), (1, 1));
        held.apply(&stored(&[3], Some(99), ids(1, 5), Medium::Gpu));
        assert_eq!(held.whole(), Whole::No);
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn larger_engine_blocks_are_keyed_by_the_hash_that_ends_them() {
        // Created for vLLM's default of 16; the engine's first store says 32.
        let mut held = Held::new(16, 1000).unwrap();
        let prompt = ids(6, 0);
        let mut event = stored(&[1, 2], None, prompt[..64].to_vec(), Medium::Gpu);
        if let Event::Stored(s) = &mut event {
            s.block_size = 32;
        }
        held.apply(&event);
        assert_eq!(held.matched(&chain(&prompt)), (64, 64));
        held.apply(&stored(&[3], None, ids(1, 9), Medium::Gpu));
        assert_eq!(held.len(), 2, "16-token blocks now are another group's");
        assert!(Held::new(24, 10).is_none());
    }

    #[test]
    fn of_a_hybrid_model_only_the_first_stores_group_is_followed() {
        let mut held = Held::new(16, 1000).unwrap();
        let in_group = |hashes: &[u64], group, from| {
            let mut event = stored(hashes, None, ids(hashes.len(), from), Medium::Gpu);
            if let Event::Stored(s) = &mut event {
                s.group = Some(group);
            }
            event
        };
        let prompt = ids(2, 0);
        held.apply(&in_group(&[1, 2], 0, 0));
        held.apply(&in_group(&[3, 4], 1, 0)); // the sliding-window group's copy
        assert_eq!(held.len(), 2);
        let removed = |group| {
            Event::Removed(Removed {
                hashes: vec![1, 2],
                medium: Medium::Gpu,
                group: Some(group),
            })
        };
        held.apply(&removed(1));
        assert_eq!(held.matched(&chain(&prompt)), (32, 32), "group 1's removal");
        held.apply(&removed(0));
        assert!(held.is_empty());
    }

    #[test]
    fn memory_is_bounded_by_max_blocks() {
        let mut held = Held::new(16, 100).unwrap();
        let hashes: Vec<u64> = (0..1000).collect();
        held.apply(&stored(&hashes, None, ids(1000, 0), Medium::Gpu));
        assert_eq!(held.len(), 100);
        assert_eq!(held.whole(), Whole::No);
    }
}
