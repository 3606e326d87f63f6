//! Reading a text given as a slice of parts without joining them.
//!
//! The logical text is the concatenation of the parts. [`Cursor`] walks it
//! part by part so the match path never builds a contiguous copy; only
//! [`Cursor::copy_rest`] copies, and only the bytes that become a new node.
//! This module also holds the fast common-prefix routine and the shard choice.
//! It knows nothing of nodes or backends.

use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64;

/// Total length in bytes of the logical text.
pub(crate) fn total_len<P: AsRef<[u8]>>(text: &[P]) -> usize {
    text.iter()
        .map(|p| p.as_ref().len())
        .fold(0, usize::saturating_add)
}

/// Shard index of a text of `total` bytes: xxh3 of its first `key_bytes`
/// bytes modulo `shards`; texts shorter than `key_bytes` go to shard 0.
pub(crate) fn shard_of<P: AsRef<[u8]>>(
    text: &[P],
    total: usize,
    key_bytes: usize,
    shards: usize,
) -> usize {
    if shards <= 1 || total < key_bytes {
        return 0;
    }
    let mut key: SmallVec<[u8; 64]> = SmallVec::new();
    for part in text {
        let need = key_bytes - key.len();
        if need == 0 {
            break;
        }
        let part = part.as_ref();
        key.extend_from_slice(&part[..need.min(part.len())]);
    }
    // `shards` fits in u64 and the remainder is < shards, so both casts are lossless.
    (xxh3_64(&key) % shards as u64) as usize
}

/// Length of the longest common prefix of `a` and `b`.
///
/// Coarse to fine: equal 4 KiB chunks, then 64-byte chunks (slice equality,
/// which uses the platform's vectorised `memcmp`), then 8-byte words, then
/// single bytes.
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    for step in [4096, 64] {
        while i + step <= n && a[i..i + step] == b[i..i + step] {
            i += step;
        }
    }
    let (words_a, _) = a[i..].as_chunks::<8>();
    let (words_b, _) = b[i..].as_chunks::<8>();
    for (x, y) in words_a.iter().zip(words_b) {
        let diff = u64::from_le_bytes(*x) ^ u64::from_le_bytes(*y);
        if diff != 0 {
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + a[i..]
        .iter()
        .zip(&b[i..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// A read position in a text made of parts. Empty parts are skipped.
pub(crate) struct Cursor<'a, P> {
    parts: &'a [P],
    /// Index of the current part; `parts.len()` at the end.
    part: usize,
    /// Offset inside the current part; always `< len` of a current part.
    offset: usize,
    /// Bytes consumed since the start of the text.
    consumed: usize,
    /// Total bytes of the text.
    total: usize,
}

impl<'a, P: AsRef<[u8]>> Cursor<'a, P> {
    /// A cursor at the start of `parts`, whose total length is `total`.
    pub(crate) fn new(parts: &'a [P], total: usize) -> Self {
        let mut cursor = Cursor {
            parts,
            part: 0,
            offset: 0,
            consumed: 0,
            total,
        };
        cursor.skip_exhausted();
        cursor
    }

    /// Bytes consumed so far (the depth in the tree).
    pub(crate) fn consumed(&self) -> usize {
        self.consumed
    }

    /// Bytes not consumed yet.
    pub(crate) fn remaining(&self) -> usize {
        self.total.saturating_sub(self.consumed)
    }

    /// The unread rest of the current part; empty at the end of the text.
    fn rest(&self) -> &'a [u8] {
        match self.parts.get(self.part) {
            Some(p) => p.as_ref().get(self.offset..).unwrap_or_default(),
            None => &[],
        }
    }

    /// The next byte, if any.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.rest().first().copied()
    }

    /// Move past `n` bytes of the current part (`n <= rest().len()`).
    fn advance(&mut self, n: usize) {
        self.offset += n;
        self.consumed += n;
        self.skip_exhausted();
    }

    /// Step over finished and empty parts.
    fn skip_exhausted(&mut self) {
        while let Some(p) = self.parts.get(self.part) {
            if self.offset < p.as_ref().len() {
                break;
            }
            self.part += 1;
            self.offset = 0;
        }
    }

    /// Match `edge` against the text at the cursor, consuming the common
    /// bytes; returns how many bytes of `edge` matched.
    pub(crate) fn match_edge(&mut self, edge: &[u8]) -> usize {
        let mut matched = 0;
        while matched < edge.len() {
            let rest = self.rest();
            if rest.is_empty() {
                break;
            }
            let want = &edge[matched..];
            let n = common_prefix(want, rest);
            matched += n;
            self.advance(n);
            if n < want.len().min(rest.len()) {
                break;
            }
        }
        matched
    }

    /// Copy the unread rest of the text into one exactly sized buffer.
    pub(crate) fn copy_rest(&self) -> Box<[u8]> {
        let mut out = Vec::with_capacity(self.remaining());
        out.extend_from_slice(self.rest());
        for part in self.parts.iter().skip(self.part + 1) {
            out.extend_from_slice(part.as_ref());
        }
        out.into_boxed_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_finds_first_difference_at_every_position() {
        let a: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        for pos in (0..200).chain(4000..4200).chain(8800..9000) {
            let mut b = a.clone();
            b[pos] ^= 0xff;
            assert_eq!(common_prefix(&a, &b), pos);
            assert_eq!(common_prefix(&b, &a[..pos]), pos);
            assert_eq!(common_prefix(&a[pos..], &b[pos..]), 0);
        }
        assert_eq!(common_prefix(&a, &a), 9000);
        assert_eq!(common_prefix(&a, &[]), 0);
    }

    #[test]
    fn cursor_matches_across_parts_and_skips_empty_ones() {
        let parts: [&[u8]; 5] = [b"", b"ab", b"", b"cdef", b"g"];
        let mut c = Cursor::new(&parts, 7);
        assert_eq!(c.match_edge(b"abcx"), 3);
        assert_eq!(c.consumed(), 3);
        assert_eq!(c.peek(), Some(b'd'));
        assert_eq!(&*c.copy_rest(), b"defg");
        assert_eq!(c.match_edge(b"defgh"), 4);
        assert_eq!(c.peek(), None);
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn short_texts_go_to_shard_zero() {
        let parts: [&[u8]; 2] = [b"abc", b"def"];
        assert_eq!(shard_of(&parts, 6, 7, 32), 0);
        let split: [&[u8]; 3] = [b"a", b"bcd", b"efgh"];
        let whole: [&[u8]; 1] = [b"abcdefghijk"];
        assert_eq!(shard_of(&split, 8, 5, 32), shard_of(&whole, 11, 5, 32));
    }
}
