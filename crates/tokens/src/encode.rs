//! From a prompt to what the prefix index keys on: the chain of hashes of its blocks of
//! [`BLOCK_TOKENS`] token ids (a vLLM block), linked as the text index links its blocks
//! (`prefix_router_core::request::blocks`), so that one hash names a whole prefix.
//!
//! Incremental: the next turn of a conversation renders whole (a template may change
//! earlier messages, Qwen3's drops earlier reasoning), but tokenizes only what follows the
//! longest prefix of the render that is byte for byte the one tokenized last time, cut
//! at an added token (`<|im_start|>`, `<|eot_id|>`, ...). The tokenizer splits its input
//! on added tokens before anything else, so the tokens before one never depend on the
//! text after it: the result is the whole render's tokens, exactly. What is kept per
//! conversation is the chain and, at each added token, a hash of the render up to it and
//! the chain's state there: about half a byte per token, bounded as a whole (LRU).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use prefix_router_core::policy::TokenBlocks;
use prefix_router_core::request::blocks::Chainer;
use prefix_router_core::units::Tokens;
use smallvec::SmallVec;
use xxhash_rust::xxh3::Xxh3;

use crate::model::Model;
use crate::render::{Prompt, Unrendered};

/// Token ids per block: vLLM's default block size.
pub const BLOCK_TOKENS: usize = 16;

/// A prompt's tokens as the index keys on them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// The chained hashes of its full blocks of token ids.
    pub chain: Vec<[u8; 8]>,
    /// Its token count.
    pub tokens: usize,
    /// Of those, tokens reused from the conversation's previous render.
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

/// A place in a render where tokenizing may restart: the start of an added token.
#[derive(Clone, Debug)]
struct Boundary {
    /// Byte offset in the render.
    offset: usize,
    /// Hash of the render up to `offset`.
    hash: u64,
    /// Tokens before it.
    tokens: usize,
    /// The added token that starts there.
    id: u32,
    /// The chain's state there.
    chainer: Chainer,
}

/// What is kept of one conversation's last render.
struct Entry {
    boundaries: Vec<Boundary>,
    chain: Vec<[u8; 8]>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.chain.len() * 8 + self.boundaries.len() * std::mem::size_of::<Boundary>() + 64
    }
}

#[derive(Default)]
struct Lru {
    map: HashMap<u128, (Arc<Entry>, u64)>,
    order: BTreeMap<u64, u128>,
    tick: u64,
    bytes: usize,
}

/// The conversations' last renders, bounded in bytes.
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

    /// Conversations held now.
    pub fn len(&self) -> usize {
        self.lru.lock().map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, key: u128) -> Option<Arc<Entry>> {
        let mut lru = self.lru.lock();
        let tick = lru.tick + 1;
        lru.tick = tick;
        let (entry, old) = lru
            .map
            .get_mut(&key)
            .map(|(e, t)| (Arc::clone(e), std::mem::replace(t, tick)))?;
        lru.order.remove(&old);
        lru.order.insert(tick, key);
        Some(entry)
    }

    fn put(&self, key: u128, entry: Entry) {
        let bytes = entry.bytes();
        let mut lru = self.lru.lock();
        let tick = lru.tick + 1;
        lru.tick = tick;
        if let Some((old, old_tick)) = lru.map.insert(key, (Arc::new(entry), tick)) {
            lru.order.remove(&old_tick);
            lru.bytes -= old.bytes();
        }
        lru.order.insert(tick, key);
        lru.bytes += bytes;
        while lru.bytes > self.budget {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = lru.map.remove(&oldest) {
                lru.bytes -= gone.bytes();
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
            } => Ok(self.pieces(text)?.ids),
            Prompt::Text {
                text,
                special: true,
            } => self.with_special_tokens(text),
        }
    }

    /// `prompt`'s tokens as chained block hashes; a rendered chat reuses what `cache`
    /// holds of conversation `key`'s previous render.
    pub fn encode(
        &self,
        prompt: &Prompt,
        key: u128,
        cache: &TokenCache,
    ) -> Result<Tokenized, Unrendered> {
        match prompt {
            Prompt::Ids(ids) => Ok(chain_of_ids(ids)),
            Prompt::Text {
                text,
                special: true,
            } => Ok(chain_of_ids(&self.with_special_tokens(text)?)),
            Prompt::Text {
                text,
                special: false,
            } => self.encode_render(text, key, cache),
        }
    }

    fn encode_render(
        &self,
        text: &str,
        key: u128,
        cache: &TokenCache,
    ) -> Result<Tokenized, Unrendered> {
        let previous = cache.get(key);
        let (start, kept) = match &previous {
            Some(entry) => resume_point(entry, text, |b| self.starts_with(text, b)),
            None => (None, 0),
        };
        let (offset, tokens, mut chainer) = match &start {
            Some(b) => (b.offset, b.tokens, b.chainer.clone()),
            None => (0, 0, Chainer::default()),
        };
        let mut chain: Vec<[u8; 8]> = match &previous {
            Some(entry) => entry.chain[..tokens / BLOCK_TOKENS].to_vec(),
            None => Vec::with_capacity(text.len() / 4 / BLOCK_TOKENS),
        };
        let mut boundaries: Vec<Boundary> = match &previous {
            Some(entry) => entry.boundaries[..kept].to_vec(),
            None => Vec::new(),
        };
        let pieces = self.pieces(&text[offset..])?;
        let mut hasher = Xxh3::new();
        hasher.update(&text.as_bytes()[..offset]);
        let mut hashed = offset;
        let mut added = pieces.added.iter().peekable();
        for (i, &id) in pieces.ids.iter().enumerate() {
            let Some(&(from, _)) = added.next_if(|(_, at)| *at == i) else {
                chainer.push(&id.to_le_bytes(), &mut chain);
                continue;
            };
            if !(i == 0 && start.is_some()) {
                let at = offset + from;
                hasher.update(&text.as_bytes()[hashed..at]);
                hashed = at;
                boundaries.push(Boundary {
                    offset: at,
                    hash: hasher.digest(),
                    tokens: tokens + i,
                    id,
                    chainer: chainer.clone(),
                });
            }
            chainer.push(&id.to_le_bytes(), &mut chain);
        }
        let total = tokens + pieces.ids.len();
        let tokenized = Tokenized {
            chain: chain.clone(),
            tokens: total,
            reused: tokens,
        };
        cache.put(key, Entry { boundaries, chain });
        Ok(tokenized)
    }
}

impl Model {
    /// `text`'s ids as the `tokenizers` crate's own pipeline gives them (no special tokens
    /// added): the reference the shortcut is tested against.
    #[doc(hidden)]
    pub fn reference_ids(&self, text: &str) -> Result<Vec<u32>, Unrendered> {
        let encoding = (self.tokenizer.encode_fast(text, false))
            .map_err(|e| Unrendered::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// `text`'s ids with the tokenizer's special tokens added (a completion's BOS).
    fn with_special_tokens(&self, text: &str) -> Result<Vec<u32>, Unrendered> {
        let encoding = (self.tokenizer.encode_fast(text, true))
            .map_err(|e| Unrendered::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Whether `text` has the added token of `boundary` at its offset: only then are the
    /// tokens before it those of the earlier render.
    fn starts_with(&self, text: &str, boundary: &Boundary) -> bool {
        let token = self.tokenizer.id_to_token(boundary.id);
        token.is_some_and(|t| text.as_bytes()[boundary.offset..].starts_with(t.as_bytes()))
    }
}

/// The last boundary of `entry` at which `text` still reads as the render it was made
/// from (up to it, and with the same added token there), and how many boundaries that
/// keeps.
fn resume_point(
    entry: &Entry,
    text: &str,
    starts_with: impl Fn(&Boundary) -> bool,
) -> (Option<Boundary>, usize) {
    let mut hasher = Xxh3::new();
    let mut hashed = 0;
    let mut found = None;
    for (kept, boundary) in entry.boundaries.iter().enumerate() {
        if boundary.offset > text.len() || !text.is_char_boundary(boundary.offset) {
            break;
        }
        hasher.update(&text.as_bytes()[hashed..boundary.offset]);
        hashed = boundary.offset;
        if hasher.digest() != boundary.hash {
            break;
        }
        if starts_with(boundary) {
            found = Some((boundary.clone(), kept + 1));
        }
    }
    match found {
        Some((boundary, kept)) => (Some(boundary), kept),
        None => (None, 0),
    }
}

/// The chain of `ids`, each id as 4 little-endian bytes.
pub fn chain_of_ids(ids: &[u32]) -> Tokenized {
    let mut chain = Vec::with_capacity(ids.len() / BLOCK_TOKENS);
    let mut chainer = Chainer::default();
    let bytes: SmallVec<[u8; 4096]> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    chainer.push(&bytes, &mut chain);
    Tokenized {
        chain,
        tokens: ids.len(),
        reused: 0,
    }
}
