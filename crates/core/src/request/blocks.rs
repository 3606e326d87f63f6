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
    let mut prev = ROOT;
    let mut carry = [0u8; BLOCK_BYTES];
    let mut filled = 0;
    for part in text.parts() {
        let mut bytes = part.as_ref();
        if filled > 0 {
            let take = (BLOCK_BYTES - filled).min(bytes.len());
            carry[filled..filled + take].copy_from_slice(&bytes[..take]);
            (filled, bytes) = (filled + take, &bytes[take..]);
            if filled < BLOCK_BYTES {
                continue;
            }
            prev = link(prev, &carry);
            hashes.push(prev.to_le_bytes());
        }
        let mut blocks = bytes.chunks_exact(BLOCK_BYTES);
        for block in &mut blocks {
            prev = link(prev, block);
            hashes.push(prev.to_le_bytes());
        }
        let rest = blocks.remainder();
        carry[..rest.len()].copy_from_slice(rest);
        filled = rest.len();
    }
    hashes
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
