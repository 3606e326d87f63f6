//! From a prompt to what the prefix index keys on: the chain of hashes of its blocks of
//! [`BLOCK_TOKENS`] token ids (a vLLM block), linked as the text index links its blocks
//! (`prefix_router_core::request::blocks`), so that one hash names a whole prefix.
//!
//! Incremental: a render is cut at its added tokens (`<|im_start|>`, `<|eot_id|>`, ...).
//! The tokenizer splits its input on those before anything else, so the text between two
//! of them tokenizes to the same ids wherever it appears. Each such segment's ids are kept
//! in a [`TokenCache`] keyed by a hash of its text, bounded in bytes (LRU). The next turn
//! of a conversation, and a new conversation opening with a system prompt or tools seen
//! before, tokenize only the segments not seen yet; the result is the whole render's ids,
//! exactly. The whole render is still made every time: a template may change earlier
//! messages (Qwen3's drops earlier reasoning), and then only the changed segments miss.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use prefix_router_core::policy::TokenBlocks;
use prefix_router_core::request::blocks::Chainer;
use prefix_router_core::units::Tokens;
use xxhash_rust::xxh3::xxh3_128;

use crate::model::Model;
use crate::render::{Prompt, Unrendered};

/// Token ids per block: vLLM's default block size.
pub const BLOCK_TOKENS: usize = 16;

/// Segments shorter than this are tokenized every time (a role name, a newline): cheaper
/// than a lookup.
const MIN_CACHED_BYTES: usize = 64;

/// Bytes a cached segment costs besides its ids (map and order entries).
const ENTRY_OVERHEAD: usize = 96;

/// A prompt's tokens as the index keys on them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// The chained hashes of its full blocks of token ids.
    pub chain: Vec<[u8; 8]>,
    /// Its token count.
    pub tokens: usize,
    /// Of those, tokens taken from the cache instead of tokenized.
    pub reused: usize,
}

impl Tokenized {
    /// As a request offers them to the policy.
    pub fn blocks(&self) -> TokenBlocks<'_> {
        TokenBlocks {
            chain: &self.chain,
            tokens: Tokens(self.tokens),
        }
    }
}

#[derive(Default)]
struct Lru {
    map: HashMap<u128, (Arc<[u32]>, u64)>,
    order: BTreeMap<u64, u128>,
    tick: u64,
    bytes: usize,
}

/// The token ids of segments seen, by a hash of their text, bounded in bytes.
pub struct TokenCache {
    lru: Mutex<Lru>,
    budget: usize,
}

impl TokenCache {
    /// A cache of at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        TokenCache {
            lru: Mutex::new(Lru::default()),
            budget,
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lru.lock().bytes
    }

    /// Segments held now.
    pub fn len(&self) -> usize {
        self.lru.lock().map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, key: u128) -> Option<Arc<[u32]>> {
        let mut lru = self.lru.lock();
        let tick = lru.tick + 1;
        lru.tick = tick;
        let (ids, old) = lru
            .map
            .get_mut(&key)
            .map(|(ids, t)| (Arc::clone(ids), std::mem::replace(t, tick)))?;
        lru.order.remove(&old);
        lru.order.insert(tick, key);
        Some(ids)
    }

    fn put(&self, key: u128, ids: &[u32]) {
        let cost = |ids: &[u32]| ids.len() * 4 + ENTRY_OVERHEAD;
        if cost(ids) > self.budget {
            return;
        }
        let mut lru = self.lru.lock();
        let tick = lru.tick + 1;
        lru.tick = tick;
        if let Some((old, old_tick)) = lru.map.insert(key, (ids.into(), tick)) {
            lru.order.remove(&old_tick);
            lru.bytes -= cost(&old);
        }
        lru.order.insert(tick, key);
        lru.bytes += cost(ids);
        while lru.bytes > self.budget {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = lru.map.remove(&oldest) {
                lru.bytes -= cost(&gone);
            }
        }
    }
}

impl Model {
    /// `prompt`'s token ids, tokenized whole (what the engine prefills).
    pub fn ids(&self, prompt: &Prompt) -> Result<Vec<u32>, Unrendered> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Text {
                text,
                special: false,
            } => self.plain_ids(text),
            Prompt::Text {
                text,
                special: true,
            } => self.with_special_tokens(text),
        }
    }

    /// `prompt`'s tokens as chained block hashes; a rendered chat takes the segments
    /// `cache` holds from it and adds those it tokenized.
    pub fn encode(&self, prompt: &Prompt, cache: &TokenCache) -> Result<Tokenized, Unrendered> {
        match prompt {
            Prompt::Ids(ids) => Ok(chain_of_ids(ids)),
            Prompt::Text {
                text,
                special: true,
            } => Ok(chain_of_ids(&self.with_special_tokens(text)?)),
            Prompt::Text {
                text,
                special: false,
            } => self.encode_render(text, cache),
        }
    }

    /// A render's ids, segment by segment through `cache`; tokenized whole when the
    /// tokenizer's added tokens cannot be found apart from it.
    fn encode_render(&self, text: &str, cache: &TokenCache) -> Result<Tokenized, Unrendered> {
        let Some(cuts) = self.cuts(text) else {
            return Ok(chain_of_ids(&self.plain_ids(text)?));
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut reused = 0;
        let mut at = 0;
        for (start, end, id) in cuts {
            reused += self.cached_segment(&text[at..start], cache, &mut ids)?;
            ids.push(id);
            at = end;
        }
        reused += self.cached_segment(&text[at..], cache, &mut ids)?;
        Ok(Tokenized {
            reused,
            ..chain_of_ids(&ids)
        })
    }

    /// Appends the ids of `segment` (no added token in it) to `ids`, from `cache` when
    /// it holds them; returns how many came from the cache.
    fn cached_segment(
        &self,
        segment: &str,
        cache: &TokenCache,
        ids: &mut Vec<u32>,
    ) -> Result<usize, Unrendered> {
        if segment.len() < MIN_CACHED_BYTES {
            self.segment_ids(segment, ids)?;
            return Ok(0);
        }
        let key = xxh3_128(segment.as_bytes());
        if let Some(hit) = cache.get(key) {
            ids.extend_from_slice(&hit);
            return Ok(hit.len());
        }
        let start = ids.len();
        self.segment_ids(segment, ids)?;
        cache.put(key, &ids[start..]);
        Ok(0)
    }

    /// `text`'s ids with the tokenizer's special tokens added (a completion's BOS).
    fn with_special_tokens(&self, text: &str) -> Result<Vec<u32>, Unrendered> {
        let encoding = (self.tokenizer.encode_fast(text, true))
            .map_err(|e| Unrendered::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// The chain of `ids`, each id as 4 little-endian bytes.
pub fn chain_of_ids(ids: &[u32]) -> Tokenized {
    let mut chain = Vec::with_capacity(ids.len() / BLOCK_TOKENS);
    let mut chainer = Chainer::default();
    let mut bytes = [0u8; 4 * 1024];
    for chunk in ids.chunks(1024) {
        for (slot, id) in bytes.chunks_exact_mut(4).zip(chunk) {
            slot.copy_from_slice(&id.to_le_bytes());
        }
        chainer.push(&bytes[..chunk.len() * 4], &mut chain);
    }
    Tokenized {
        chain,
        tokens: ids.len(),
        reused: 0,
    }
}
