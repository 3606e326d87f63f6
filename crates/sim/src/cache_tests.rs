//! Unit tests of the block cache arithmetic (a child module of `cache`).

use super::*;

/// 16 tokens of 4 bytes per block, as the defaults.
const BT: usize = 16;
const BB: usize = 64;

/// A prompt of `blocks` full blocks whose block `i` is filled with byte `tag(i)`.
fn prompt(tags: &[u8]) -> Vec<u8> {
    tags.iter()
        .flat_map(|&t| std::iter::repeat_n(t, BB))
        .collect()
}

/// Admits a prompt of whole blocks (no partial block) with the vLLM cap and no output blocks.
fn admit(cache: &mut BlockCache, bytes: &[u8]) -> Option<Allocation> {
    let hashes = block_hashes(bytes, BB);
    let tokens = bytes.len().div_ceil(4);
    let cap = max_hit_blocks(tokens, hashes.len(), BT);
    cache.allocate(&hashes, cap, tokens.div_ceil(BT))
}

#[test]
fn hashes_cover_only_full_blocks_and_chain() {
    assert_eq!(block_hashes(&[7; 63], BB).len(), 0);
    assert_eq!(block_hashes(&[7; 64], BB).len(), 1);
    assert_eq!(block_hashes(&[7; 200], BB).len(), 3);
    let a = block_hashes(&prompt(b"ab"), BB);
    let b = block_hashes(&prompt(b"bb"), BB);
    // Same bytes in block 1, different parent: different hash.
    assert_ne!(a[1], b[1]);
    assert_eq!(a[0], block_hashes(&prompt(b"ax"), BB)[0]);
}

#[test]
fn last_token_cap() {
    // Exactly 2 blocks (32 tokens): at most 1 block may hit (31 tokens).
    assert_eq!(max_hit_blocks(32, 2, BT), 1);
    // 33 tokens: both full blocks may hit.
    assert_eq!(max_hit_blocks(33, 2, BT), 2);
    assert_eq!(max_hit_blocks(1, 0, BT), 0);
    assert_eq!(max_hit_blocks(0, 0, BT), 0);
    assert_eq!(max_hit_blocks(16, 1, BT), 0);
}

#[test]
fn fully_cached_prompt_recomputes_its_last_block() {
    let mut cache = BlockCache::new(100);
    let p = prompt(b"abcd");
    let first = admit(&mut cache, &p).unwrap();
    assert_eq!(first.hit_blocks(), 0);
    cache.release(first);
    let again = admit(&mut cache, &p).unwrap();
    // 64 tokens, all cached: hit 3 blocks = 48 tokens, the last block is recomputed.
    assert_eq!(again.hit_blocks(), 3);
    // With one more byte the prompt has 65 tokens and all 4 full blocks hit.
    let mut longer = p.clone();
    longer.push(b'!');
    let hashes = block_hashes(&longer, BB);
    assert_eq!(
        cache.hit_blocks(
            &hashes,
            max_hit_blocks(longer.len().div_ceil(4), hashes.len(), BT)
        ),
        4
    );
}

#[test]
fn shared_prefix_hits_and_divergence_mid_block_misses_that_block() {
    let mut cache = BlockCache::new(100);
    let a = admit(&mut cache, &prompt(b"abcdz")).unwrap();
    cache.release(a);
    // Shares 3 blocks, then diverges.
    let b = admit(&mut cache, &prompt(b"abcyy")).unwrap();
    assert_eq!(b.hit_blocks(), 3);
    // Diverges in the middle of block 2: blocks 0 and 1 hit only.
    let mut c = prompt(b"abcdz");
    c[2 * BB + 10] = b'#';
    let hashes = block_hashes(&c, BB);
    assert_eq!(cache.hit_blocks(&hashes, hashes.len()), 2);
    cache.release(b);
}

#[test]
fn partial_trailing_block_is_never_cached() {
    let mut cache = BlockCache::new(100);
    let mut p = prompt(b"ab");
    p.extend_from_slice(&[b'c'; 40]); // 2 full blocks + 40 bytes
    let hashes = block_hashes(&p, BB);
    assert_eq!(hashes.len(), 2);
    let a = cache.allocate(&hashes, 2, 3).unwrap();
    assert_eq!(cache.cached(), 2);
    assert_eq!(cache.pinned(), 3);
    cache.release(a);
    // Completing the partial block later gives a new hash that was never cached.
    p.extend_from_slice(&[b'c'; 24]);
    let longer = block_hashes(&p, BB);
    assert!(!cache.contains(longer[2]));
    assert_eq!(cache.hit_blocks(&longer, 3), 2);
}

#[test]
fn running_requests_share_pinned_blocks() {
    let mut cache = BlockCache::new(100);
    let a = admit(&mut cache, &prompt(b"abcde")).unwrap();
    let b = admit(&mut cache, &prompt(b"abcxy")).unwrap();
    assert_eq!(b.hit_blocks(), 3);
    assert_eq!(&a.blocks()[..3], &b.blocks()[..3]);
    // 5 + 2 distinct blocks pinned.
    assert_eq!(cache.pinned(), 7);
    cache.release(a);
    // Shared blocks stay pinned by b; a's two own blocks are free.
    assert_eq!(cache.pinned(), 5);
    cache.release(b);
    assert_eq!(cache.pinned(), 0);
    assert_eq!(cache.free(), 100);
    assert_eq!(cache.cached(), 7);
}

#[test]
fn release_puts_tail_blocks_first_on_the_free_queue() {
    let mut cache = BlockCache::new(4);
    let a = admit(&mut cache, &prompt(b"abc")).unwrap();
    let ids = a.blocks().to_vec();
    cache.release(a);
    let queue = cache.free_queue();
    // The untouched block 3 is first, then a's blocks tail first.
    assert_eq!(&queue[1..], &[ids[2], ids[1], ids[0]]);
    // Taking two blocks evicts the unused one and a's tail block: head blocks survive.
    let other = admit(&mut cache, &prompt(b"xy")).unwrap();
    let hashes = block_hashes(&prompt(b"abc"), BB);
    assert!(cache.contains(hashes[0]) && cache.contains(hashes[1]));
    assert!(!cache.contains(hashes[2]));
    cache.release(other);
}

#[test]
fn least_recently_released_request_is_evicted_first() {
    let mut cache = BlockCache::new(4);
    let a = admit(&mut cache, &prompt(b"aa")).unwrap();
    let b = admit(&mut cache, &prompt(b"bb")).unwrap();
    cache.release(a);
    cache.release(b);
    // Two new blocks: both of a's go (released first), b stays cached.
    let c = admit(&mut cache, &prompt(b"cc")).unwrap();
    assert_eq!(c.hit_blocks(), 0);
    let ha = block_hashes(&prompt(b"aa"), BB);
    let hb = block_hashes(&prompt(b"bb"), BB);
    assert!(!cache.contains(ha[0]) && !cache.contains(ha[1]));
    assert!(cache.contains(hb[0]) && cache.contains(hb[1]));
    cache.release(c);
}

#[test]
fn a_hit_refreshes_recency() {
    let mut cache = BlockCache::new(4);
    let a = admit(&mut cache, &prompt(b"aa")).unwrap();
    let b = admit(&mut cache, &prompt(b"bb")).unwrap();
    cache.release(a);
    cache.release(b);
    // Reuse a's first block (hit), then release: a's block is now the most recent.
    let hashes = block_hashes(&prompt(b"aa"), BB);
    let again = cache.allocate(&hashes[..1], 1, 1).unwrap();
    assert_eq!(again.hit_blocks(), 1);
    cache.release(again);
    // Three new blocks: a's second block, then b's blocks are evicted; a's first survives.
    let c = admit(&mut cache, &prompt(b"ccc")).unwrap();
    assert!(cache.contains(hashes[0]));
    assert!(!cache.contains(hashes[1]));
    cache.release(c);
}

#[test]
fn pinned_blocks_are_never_evicted_and_requests_wait_when_full() {
    let mut cache = BlockCache::new(4);
    let a = admit(&mut cache, &prompt(b"abc")).unwrap();
    // One block free: a 2-block request does not fit and nothing changes.
    assert!(admit(&mut cache, &prompt(b"xy")).is_none());
    assert_eq!(cache.pinned(), 3);
    assert_eq!(cache.free(), 1);
    let hashes = block_hashes(&prompt(b"abc"), BB);
    assert!(hashes.iter().all(|&h| cache.contains(h)));
    // A 1-block request fits in the one free block.
    let x = admit(&mut cache, &prompt(b"x")).unwrap();
    assert_eq!(cache.pinned(), 4);
    assert_eq!(cache.usage(), 1.0);
    cache.release(a);
    assert!(admit(&mut cache, &prompt(b"xy")).is_some());
    cache.release(x);
}

#[test]
fn hit_blocks_on_the_free_queue_do_not_count_as_free_space() {
    let mut cache = BlockCache::new(4);
    let a = admit(&mut cache, &prompt(b"abc")).unwrap();
    cache.release(a);
    // Needs "ab" (hit, taken off the free queue) + 3 new blocks = 5 > 4.
    let hashes = block_hashes(&prompt(b"abzzz"), BB);
    assert!(cache.allocate(&hashes, 4, 5).is_none());
    assert_eq!(cache.free(), 4);
    // 2 hits + 2 new fits exactly, evicting the unused block and "c".
    let fit = cache.allocate(&hashes[..4], 3, 4).unwrap();
    assert_eq!(fit.hit_blocks(), 2);
    assert_eq!(cache.pinned(), 4);
}

#[test]
fn capacity_accounting_with_output_blocks() {
    let mut cache = BlockCache::new(10);
    let hashes = block_hashes(&prompt(b"abc"), BB);
    // 3 prompt blocks + 4 output blocks: only the prompt blocks are cached.
    let a = cache.allocate(&hashes, 2, 7).unwrap();
    assert_eq!(a.blocks().len(), 7);
    assert_eq!(cache.pinned(), 7);
    assert_eq!(cache.cached(), 3);
    assert!((cache.usage() - 0.7).abs() < 1e-12);
    cache.release(a);
    assert_eq!(cache.pinned(), 0);
    assert_eq!(cache.free_queue().len(), 10);
}

#[test]
fn capped_duplicate_block_stays_anonymous() {
    let mut cache = BlockCache::new(10);
    let p = prompt(b"ab");
    let a = admit(&mut cache, &p).unwrap();
    // Same prompt while a runs: hit capped at 1, block 1 is recomputed in a fresh block.
    let b = admit(&mut cache, &p).unwrap();
    assert_eq!(b.hit_blocks(), 1);
    assert_ne!(a.blocks()[1], b.blocks()[1]);
    assert_eq!(cache.cached(), 2);
    cache.release(a);
    cache.release(b);
    assert_eq!(cache.cached(), 2);
    assert_eq!(cache.free(), 10);
}

#[test]
fn a_hit_waits_while_its_blocks_are_pending() {
    let mut cache = BlockCache::new(10);
    let p = prompt(b"abc");
    let a = admit(&mut cache, &p).unwrap();
    let b = admit(&mut cache, &p).unwrap();
    assert_eq!(b.hit_blocks(), 2);
    assert!(!cache.waits(&a), "a hit nothing");
    assert!(cache.waits(&b), "b hit a's blocks before a computed them");
    cache.computed(&a);
    assert!(!cache.waits(&b));
    // Released blocks count as computed: a later hit on them does not wait.
    cache.release(b);
    let c = admit(&mut cache, &prompt(b"xy")).unwrap();
    cache.release(c);
    let d = admit(&mut cache, &p).unwrap();
    assert!(!cache.waits(&d));
}
