//! The simulated KV block cache: vLLM's automatic prefix caching, as pure data.
//!
//! For: deciding how many leading prompt blocks of a request are already cached
//! (the prefix-cache hit), pinning them while the request runs, allocating the
//! rest, and evicting unpinned cached blocks in vLLM's LRU order.
//! Not for: time, queueing or I/O (see `engine`), nor for turning requests into
//! bytes (see `template`). Everything here is deterministic and synchronous.
//!
//! Model, following vLLM's block pool:
//! - The prompt is cut into blocks of `block_bytes` bytes (`block_tokens` tokens
//!   of `bytes_per_token` bytes). Only full blocks get a hash; block `i`'s hash is
//!   xxh3 of (block `i-1`'s hash, block `i`'s bytes), so a hash names the whole
//!   prefix up to and including that block.
//! - Every block of the pool is either *pinned* (reference count > 0, used by a
//!   running request) or on the *free queue* (reference count 0). A block on the
//!   free queue may still hold a cached hash; it can be hit (which takes it off the
//!   queue and pins it) until it is reused for another allocation, which evicts it.
//! - Allocation takes blocks from the front of the free queue. Released blocks are
//!   appended to the back in reverse order (a request's tail block first), so the
//!   least recently released blocks, and within one request the block covering the
//!   most tokens, are evicted first.
//! - A newly allocated block is *pending* until its request's prefill computed it
//!   ([`BlockCache::computed`]). Its hash is registered at once (vLLM caches a block
//!   when the step that computes it is scheduled), so a concurrent request may hit it,
//!   but that request's first token waits until no block it hit is pending
//!   ([`BlockCache::waits`]); it never gets ahead of the prefill it shares.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::Xxh3;

/// Hash of one full block, chained over all blocks before it.
pub type BlockHash = u64;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Seed standing in for the parent hash of the first block.
const ROOT_HASH: BlockHash = 0x5eed_0fb1_0c4a_5400;

/// Chained hashes of every *full* block of `prompt` (a trailing partial block has none).
///
/// `block_bytes` is `block_tokens * bytes_per_token` (64 with the defaults); it must be > 0.
pub fn block_hashes(prompt: &[u8], block_bytes: usize) -> Vec<BlockHash> {
    let mut parent = ROOT_HASH;
    prompt
        .chunks_exact(block_bytes.max(1))
        .map(|block| {
            let mut hasher = Xxh3::new();
            hasher.update(&parent.to_le_bytes());
            hasher.update(block);
            parent = hasher.digest();
            parent
        })
        .collect()
}

/// The most leading blocks a request of `prompt_tokens` tokens may take from the
/// cache: vLLM caps the hit at `prompt_tokens - 1` tokens so the last prompt token
/// is always computed (it yields the first output token). Hence a prompt of
/// exactly `k * block_tokens` tokens can hit at most `k - 1` blocks, while one of
/// `k * block_tokens + 1` tokens can hit all `k` full blocks.
pub fn max_hit_blocks(prompt_tokens: usize, full_blocks: usize, block_tokens: usize) -> usize {
    full_blocks.min(prompt_tokens.saturating_sub(1) / block_tokens.max(1))
}

/// A change to what the cache holds, as vLLM's KV events report it (logged only when
/// [`BlockCache::log_changes`] turned the log on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Blocks were cached: the prompt's blocks `first..first + hashes.len()`, continuing
    /// the block `parent` (none for the first block). `token_ids` is left empty here; the
    /// engine, which has the prompt, fills it.
    Stored {
        /// The blocks' hashes, in order.
        hashes: Vec<BlockHash>,
        /// The hash of the block before the first.
        parent: Option<BlockHash>,
        /// Index of the first among the prompt's blocks.
        first: usize,
        /// Their token ids, `block_tokens` per block.
        token_ids: Vec<u32>,
    },
    /// Cached blocks were evicted.
    Removed(Vec<BlockHash>),
    /// Every cached block was forgotten.
    Cleared,
}

/// Blocks a request holds from admission to completion (hit blocks first, then
/// newly allocated ones in prompt order, then its partial and output blocks).
#[derive(Debug)]
pub struct Allocation {
    blocks: Vec<BlockId>,
    hit_blocks: usize,
}

impl Allocation {
    /// Leading blocks that were already cached when the request was admitted.
    pub fn hit_blocks(&self) -> usize {
        self.hit_blocks
    }

    /// All blocks held, in prompt order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }
}

#[derive(Clone, Debug)]
struct BlockSlot {
    hash: Option<BlockHash>,
    refs: u32,
    /// Allocated to a request whose prefill has not computed it yet.
    pending: bool,
    prev: u32,
    next: u32,
}

/// Hasher for keys that already are uniformly distributed 64-bit hashes.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type HashIndex = HashMap<BlockHash, BlockId, BuildHasherDefault<IdentityHasher>>;

/// A fixed pool of KV blocks with vLLM's prefix-cache and eviction rules.
#[derive(Debug)]
pub struct BlockCache {
    slots: Vec<BlockSlot>,
    index: HashIndex,
    head: u32,
    tail: u32,
    free_len: usize,
    evicted: u64,
    /// Changes since the last [`BlockCache::take_changes`], when logged.
    log: Option<Vec<Change>>,
}

impl BlockCache {
    /// A pool of `capacity` blocks, all free and empty. Capacity is capped at
    /// `u32::MAX - 1` blocks.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(NIL as usize - 1);
        let slots = (0..capacity)
            .map(|_| BlockSlot {
                hash: None,
                refs: 0,
                pending: false,
                prev: NIL,
                next: NIL,
            })
            .collect();
        let mut cache = Self {
            slots,
            index: HashIndex::default(),
            head: NIL,
            tail: NIL,
            free_len: 0,
            evicted: 0,
            log: None,
        };
        for id in 0..capacity as u32 {
            cache.push_back(id);
        }
        cache
    }

    /// Starts logging changes (for KV events).
    pub fn log_changes(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The changes logged since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Total blocks in the pool.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Blocks held by running requests (reference count > 0).
    pub fn pinned(&self) -> usize {
        self.slots.len() - self.free_len
    }

    /// Blocks on the free queue (empty or cached but unpinned): what an allocation can use.
    pub fn free(&self) -> usize {
        self.free_len
    }

    /// Cached blocks evicted so far (reused for other content).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Blocks currently holding a cached hash, pinned or not.
    pub fn cached(&self) -> usize {
        self.index.len()
    }

    /// Fraction of the pool pinned by running requests, 0..=1 (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.slots.is_empty() {
            0.0
        } else {
            self.pinned() as f64 / self.slots.len() as f64
        }
    }

    /// Whether a block with this hash is cached (pinned or on the free queue).
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.index.contains_key(&hash)
    }

    /// Leading blocks of `hashes` that are cached, at most `cap` (see [`max_hit_blocks`]).
    pub fn hit_blocks(&self, hashes: &[BlockHash], cap: usize) -> usize {
        hashes
            .iter()
            .take(cap)
            .take_while(|h| self.index.contains_key(h))
            .count()
    }

    /// Admits a request: pins its cached leading blocks (at most `cap`), then takes
    /// `total_blocks - hit` blocks from the front of the free queue, evicting what
    /// they cached, and registers the request's remaining full prompt blocks under
    /// their hashes. Returns `None`, changing nothing, when not enough blocks are free.
    pub fn allocate(
        &mut self,
        hashes: &[BlockHash],
        cap: usize,
        total_blocks: usize,
    ) -> Option<Allocation> {
        let hit_ids: Vec<BlockId> = hashes
            .iter()
            .take(cap)
            .map_while(|h| self.index.get(h).copied())
            .collect();
        let hit = hit_ids.len();
        let hits_on_free_queue = hit_ids
            .iter()
            .filter(|&&id| self.slots[id as usize].refs == 0)
            .count();
        let needed = total_blocks.max(hit) - hit;
        if needed > self.free_len - hits_on_free_queue {
            return None;
        }
        let mut blocks = hit_ids;
        blocks.reserve(needed);
        for &id in &blocks {
            self.pin(id);
        }
        let mut stored = Vec::new();
        for position in hit..hit + needed {
            let id = self.take_front()?;
            if let Some(&hash) = hashes.get(position)
                && self.register(id, hash)
            {
                stored.push(position);
            }
            blocks.push(id);
        }
        self.log_stored(hashes, &stored);
        Some(Allocation {
            blocks,
            hit_blocks: hit,
        })
    }

    /// Whether a block `allocation` hit is still pending: its request's first token
    /// must wait for the prefill computing it.
    pub fn waits(&self, allocation: &Allocation) -> bool {
        (allocation.blocks.iter().take(allocation.hit_blocks))
            .any(|&id| self.slots[id as usize].pending)
    }

    /// Marks the blocks `allocation` newly allocated as computed (its prefill ended).
    pub fn computed(&mut self, allocation: &Allocation) {
        for &id in allocation.blocks.iter().skip(allocation.hit_blocks) {
            self.slots[id as usize].pending = false;
        }
    }

    /// Forgets every cached hash at once, as an engine restart or vLLM's
    /// `/reset_prefix_cache` does; blocks pinned by running requests stay theirs,
    /// anonymous. Counts nothing as evicted.
    pub fn forget_all(&mut self) {
        self.index.clear();
        for slot in &mut self.slots {
            slot.hash = None;
        }
        if let Some(log) = &mut self.log {
            log.push(Change::Cleared);
        }
    }

    /// Unpins an aborted request's blocks, as [`Self::release`], after forgetting the
    /// hashes of those from position `computed` on: their KV was never computed, so
    /// only its first `computed` blocks stay cached (like vLLM, which caches a block
    /// once its prefill step computed it). A block another request hit stays cached and
    /// counts as computed, so that request does not wait for it forever.
    pub fn release_computed(&mut self, allocation: Allocation, computed: usize) {
        for &id in allocation.blocks.iter().skip(computed) {
            let slot = &mut self.slots[id as usize];
            if slot.refs > 1 {
                continue;
            }
            if let Some(hash) = slot.hash.take() {
                self.index.remove(&hash);
                if let Some(log) = &mut self.log {
                    match log.last_mut() {
                        Some(Change::Removed(hashes)) => hashes.push(hash),
                        _ => log.push(Change::Removed(vec![hash])),
                    }
                }
            }
        }
        self.release(allocation);
    }

    /// Unpins a finished (or aborted) request's blocks, all of them computed from now
    /// on; those no longer used by any request go to the back of the free queue, tail
    /// block first.
    pub fn release(&mut self, allocation: Allocation) {
        self.computed(&allocation);
        for &id in allocation.blocks.iter().rev() {
            let slot = &mut self.slots[id as usize];
            slot.refs = slot.refs.saturating_sub(1);
            if slot.refs == 0 {
                self.push_back(id);
            }
        }
    }

    fn pin(&mut self, id: BlockId) {
        if self.slots[id as usize].refs == 0 {
            self.unlink(id);
        }
        self.slots[id as usize].refs += 1;
    }

    /// Pops the front of the free queue, evicting its cached hash, and pins it.
    fn take_front(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        if let Some(hash) = self.slots[id as usize].hash.take() {
            self.index.remove(&hash);
            self.evicted += 1;
            if let Some(log) = &mut self.log {
                match log.last_mut() {
                    Some(Change::Removed(hashes)) => hashes.push(hash),
                    _ => log.push(Change::Removed(vec![hash])),
                }
            }
        }
        let slot = &mut self.slots[id as usize];
        (slot.refs, slot.pending) = (1, true);
        Some(id)
    }

    /// Caches `id` under `hash` unless another block already does (then `id` stays
    /// anonymous); returns whether it did.
    fn register(&mut self, id: BlockId, hash: BlockHash) -> bool {
        let std::collections::hash_map::Entry::Vacant(entry) = self.index.entry(hash) else {
            return false;
        };
        entry.insert(id);
        self.slots[id as usize].hash = Some(hash);
        true
    }

    /// Logs the prompt blocks at `positions` (ascending) as stored, one change per run.
    fn log_stored(&mut self, hashes: &[BlockHash], positions: &[usize]) {
        let Some(log) = &mut self.log else {
            return;
        };
        for run in positions.chunk_by(|a, b| a + 1 == *b) {
            let first = run[0];
            log.push(Change::Stored {
                hashes: run.iter().map(|&p| hashes[p]).collect(),
                parent: first.checked_sub(1).map(|p| hashes[p]),
                first,
                token_ids: Vec::new(),
            });
        }
    }

    fn push_back(&mut self, id: BlockId) {
        let old_tail = self.tail;
        let slot = &mut self.slots[id as usize];
        slot.prev = old_tail;
        slot.next = NIL;
        if old_tail == NIL {
            self.head = id;
        } else {
            self.slots[old_tail as usize].next = id;
        }
        self.tail = id;
        self.free_len += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let BlockSlot { prev, next, .. } = self.slots[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let slot = &mut self.slots[id as usize];
        slot.prev = NIL;
        slot.next = NIL;
        self.free_len -= 1;
    }

    /// Block ids on the free queue, front (next to be evicted) first. For tests and debugging.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.free_len);
        let mut id = self.head;
        while id != NIL {
            out.push(id);
            id = self.slots[id as usize].next;
        }
        out
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
