//! A routing text as a chain of block hashes: the text cut into fixed blocks of
//! [`BLOCK_BYTES`] (about 16 tokens, a vLLM block), each hashed together with the hash
//! before it, so that one hash names the whole prefix up to its block. The prefix index
//! keys on these 8-byte hashes instead of the text: an eighth of the memory, and matches
//! compare an eighth of the bytes. A last partial block is not hashed (vLLM caches only
//! full blocks too). The text is read in place, part by part; the hashes are the only
//! allocation.

use xxhash_rust::xxh3::xxh3_64;

use super::RoutingText;
use crate::units::BLOCK_BYTES;

/// Hash of the empty prefix, linked to the first block.
const ROOT: u64 = 0x9a7c_1d2e_5b3f_4061;

/// The hash of the prefix ending with `block`, given the hash `prev` of the prefix before
/// it. The block's own hash does not wait for `prev`, so consecutive blocks overlap in the
/// CPU; only the folded multiply that links them waits for the previous link (seeding
/// each block's xxh3 with `prev` instead made hashing 1.7x slower).
#[inline]
fn link(prev: u64, block: &[u8]) -> u64 {
    let product = u128::from(prev ^ xxh3_64(block)) * u128::from(LINK);
    (product as u64) ^ ((product >> 64) as u64)
}

/// Odd multiplier of [`link`] (the golden ratio's 64-bit fraction).
const LINK: u64 = 0x9e37_79b9_7f4a_7c15;

/// The chained hashes of every full block of `text`, each as 8 little-endian bytes.
pub fn chain(text: &RoutingText) -> Vec<[u8; 8]> {
    let mut hashes = Vec::with_capacity(text.len() / BLOCK_BYTES);
    let mut chainer = Chainer::default();
    for part in text.parts() {
        chainer.push(part.as_ref(), &mut hashes);
    }
    hashes
}

/// A chain being built as bytes arrive: each full block hashed and linked to the one
/// before it; the bytes of a last partial block wait for more. Cloning it keeps its place
/// (to resume a chain later from the same point).
#[derive(Clone, Debug)]
pub struct Chainer {
    prev: u64,
    carry: [u8; BLOCK_BYTES],
    filled: usize,
}

impl Default for Chainer {
    fn default() -> Self {
        Chainer {
            prev: ROOT,
            carry: [0; BLOCK_BYTES],
            filled: 0,
        }
    }
}

impl Chainer {
    /// A chain continuing the prefix whose last full block's hash is `prev`.
    pub fn resume(prev: [u8; 8]) -> Chainer {
        Chainer {
            prev: u64::from_le_bytes(prev),
            ..Chainer::default()
        }
    }

    /// Appends `bytes`, pushing the hash of every block they complete onto `hashes`.
    pub fn push(&mut self, mut bytes: &[u8], hashes: &mut Vec<[u8; 8]>) {
        if self.filled > 0 {
            let take = (BLOCK_BYTES - self.filled).min(bytes.len());
            self.carry[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            (self.filled, bytes) = (self.filled + take, &bytes[take..]);
            if self.filled < BLOCK_BYTES {
                return;
            }
            self.prev = link(self.prev, &self.carry);
            hashes.push(self.prev.to_le_bytes());
            self.filled = 0;
        }
        let mut blocks = bytes.chunks_exact(BLOCK_BYTES);
        for block in &mut blocks {
            self.prev = link(self.prev, block);
            hashes.push(self.prev.to_le_bytes());
        }
        let rest = blocks.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }

    /// The bytes waiting for their block to fill.
    pub fn pending(&self) -> &[u8] {
        &self.carry[..self.filled]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(parts: &[&'static str]) -> RoutingText<'static> {
        let mut t = RoutingText::default();
        parts.iter().for_each(|p| t.push(p.as_bytes()));
        t
    }

    #[test]
    fn the_chain_depends_on_the_bytes_not_on_how_they_are_cut_into_parts() {
        let whole = "a conversation of some length, ".repeat(20);
        let one = chain(&text(&[Box::leak(whole.clone().into_boxed_str())]));
        assert_eq!(one.len(), whole.len() / BLOCK_BYTES);
        for cut in [1, 63, 64, 65, 200, whole.len() - 1] {
            let (a, b) = whole.split_at(cut);
            let parts: [&'static str; 2] = [Box::leak(a.into()), Box::leak(b.into())];
            assert_eq!(chain(&text(&parts)), one, "cut at {cut}");
        }
    }

    #[test]
    fn a_shared_prefix_shares_its_hashes_and_nothing_after() {
        let base = "x".repeat(300);
        let a = chain(&text(&[Box::leak(
            format!("{base}first turn and more text").into_boxed_str(),
        )]));
        let b = chain(&text(&[Box::leak(
            format!("{base}other turn and more text").into_boxed_str(),
        )]));
        let shared = 300 / BLOCK_BYTES;
        assert_eq!(a[..shared], b[..shared]);
        assert_ne!(a[shared], b[shared]);
        assert!(chain(&text(&["short"])).is_empty());
    }
}
