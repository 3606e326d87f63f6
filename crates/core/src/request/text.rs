//! The routing text: the conversation as the prefix tree sees it.
//!
//! A routing text is a list of parts whose concatenation is the text. Parts borrow the
//! request body (the escaped bytes of JSON strings as they stand) or short static markers,
//! so building one copies nothing of the body. This module only assembles parts; it knows
//! nothing of JSON or of the tree.

use xxhash_rust::xxh3::xxh3_64;

/// Longest inline marker, in bytes (a tag plus a 16-digit hash fits).
const INLINE_MAX: usize = 30;

/// One piece of a routing text.
#[derive(Clone, Copy, Debug)]
pub enum Part<'a> {
    /// Bytes of the request body, or a static marker.
    Borrowed(&'a [u8]),
    /// A short marker made for this request (e.g. the hash of an image).
    Inline { buf: [u8; INLINE_MAX], len: u8 },
}

impl AsRef<[u8]> for Part<'_> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Part::Borrowed(bytes) => bytes,
            Part::Inline { buf, len } => &buf[..usize::from(*len)],
        }
    }
}

/// A position in a routing text, to insert parts at later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    parts: usize,
    len: usize,
}

/// Empty parts kept for [`RoutingText::fill`].
#[derive(Clone, Copy, Debug)]
pub struct Reserved {
    at: usize,
    slots: usize,
    len: usize,
}

impl Reserved {
    /// The position right after the reserved parts, as it stands before they are filled.
    pub fn end(&self) -> Mark {
        Mark {
            parts: self.at + self.slots,
            len: self.len,
        }
    }
}

/// The text a request is routed on, as borrowed parts.
#[derive(Debug, Default)]
pub struct RoutingText<'a> {
    parts: Vec<Part<'a>>,
    len: usize,
    anchor: Option<usize>,
    system_end: Option<Mark>,
}

impl<'a> RoutingText<'a> {
    /// An empty text with room for `parts` parts.
    pub fn with_capacity(parts: usize) -> Self {
        RoutingText {
            parts: Vec::with_capacity(parts),
            len: 0,
            anchor: None,
            system_end: None,
        }
    }

    /// Appends borrowed bytes; empty slices are skipped.
    pub fn push(&mut self, bytes: &'a [u8]) {
        if !bytes.is_empty() {
            self.len += bytes.len();
            self.parts.push(Part::Borrowed(bytes));
        }
    }

    /// Appends `tag` followed by a 16-hex-digit hash of `data`: a stable stand-in for
    /// content whose bytes should not be routed on (images, audio, files).
    pub fn push_digest(&mut self, tag: &[u8], data: &[u8]) {
        let mut buf = [0u8; INLINE_MAX];
        let tag = &tag[..tag.len().min(INLINE_MAX - 17)];
        buf[..tag.len()].copy_from_slice(tag);
        let hex = format_hex(xxh3_64(data));
        buf[tag.len()..tag.len() + 16].copy_from_slice(&hex);
        buf[tag.len() + 16] = b'>';
        let len = tag.len() + 17;
        self.len += len;
        // `len` is at most INLINE_MAX (30), so it fits a u8.
        self.parts.push(Part::Inline {
            buf,
            len: len as u8,
        });
    }

    /// The current end, to insert before later.
    pub fn mark(&self) -> Mark {
        Mark {
            parts: self.parts.len(),
            len: self.len,
        }
    }

    /// Inserts `pieces` at `mark` (a role marker once the role is known, tools once the
    /// whole body was read); empty pieces are skipped.
    pub fn insert(&mut self, mark: Mark, pieces: &[&'a [u8]]) {
        let added: usize = pieces.iter().map(|p| p.len()).sum();
        if mark.parts == self.parts.len() {
            pieces.iter().for_each(|p| self.push(p));
            return;
        }
        let parts = pieces
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| Part::Borrowed(p));
        self.parts.splice(mark.parts..mark.parts, parts);
        self.len += added;
        if let Some(anchor) = self.anchor.as_mut().filter(|a| **a > mark.len) {
            *anchor += added;
        }
    }

    /// Reserves `slots` empty parts at the current end, to [`fill`](Self::fill) later
    /// without moving what comes after (instructions, which a body may list after its
    /// input).
    pub fn reserve(&mut self, slots: usize) -> Reserved {
        let at = self.parts.len();
        self.parts
            .extend(std::iter::repeat_n(Part::Borrowed(&[]), slots));
        Reserved {
            at,
            slots,
            len: self.len,
        }
    }

    /// Fills reserved parts with `pieces` (at most as many as were reserved).
    pub fn fill(&mut self, reserved: Reserved, pieces: &[&'a [u8]]) {
        let added: usize = pieces.iter().take(reserved.slots).map(|p| p.len()).sum();
        for (slot, piece) in self.parts[reserved.at..reserved.at + reserved.slots]
            .iter_mut()
            .zip(pieces)
        {
            *slot = Part::Borrowed(piece);
        }
        self.len += added;
        if let Some(anchor) = self.anchor.as_mut().filter(|a| **a > reserved.len) {
            *anchor += added;
        }
    }

    /// Marks the current end as the conversation's anchor (the end of its first user
    /// message), once: the part of the text that identifies a conversation.
    pub fn mark_anchor(&mut self) {
        if self.anchor.is_none() {
            self.anchor = Some(self.len);
        }
    }

    /// Marks the current end as the end of the conversation's system prompt, once: where a
    /// chat template renders the tools (see [`system_end`](Self::system_end)).
    pub fn mark_system_end(&mut self) {
        if self.system_end.is_none() {
            self.system_end = Some(self.mark());
        }
    }

    /// Where the system prompt ends, if one was marked.
    pub fn system_end(&self) -> Option<Mark> {
        self.system_end
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part<'a>] {
        &self.parts
    }

    /// Length of the text, as a size.
    pub fn size(&self) -> crate::units::TextBytes {
        crate::units::TextBytes(self.len())
    }

    /// Length of the text in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the text ends at its first user message: a conversation's opening turn.
    pub fn is_opening(&self) -> bool {
        self.anchor == Some(self.len)
    }

    /// Length of the anchor prefix in bytes: up to the end of the first user message, or the
    /// whole text when there is none.
    pub fn anchor_len(&self) -> usize {
        self.anchor.unwrap_or(self.len)
    }

    /// A 128-bit hash of the anchor: the same over every turn of a conversation.
    pub fn anchor_hash(&self) -> u128 {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        self.for_each_prefix(self.anchor_len(), |b| hasher.update(b));
        hasher.digest128()
    }

    /// Feeds the first `limit` bytes of the text to `sink`, part by part.
    pub fn for_each_prefix(&self, limit: usize, mut sink: impl FnMut(&[u8])) {
        let mut left = limit;
        for part in &self.parts {
            if left == 0 {
                break;
            }
            let bytes = part.as_ref();
            let take = bytes.len().min(left);
            sink(&bytes[..take]);
            left -= take;
        }
    }

    /// The text as one buffer. For tests and debugging only: routing never needs it.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.for_each_prefix(self.len, |b| out.extend_from_slice(b));
        out
    }
}

fn format_hex(value: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, slot) in out.iter_mut().enumerate() {
        let shift = 60 - 4 * i;
        *slot = DIGITS[((value >> shift) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_concatenate_and_skip_empty() {
        let mut text = RoutingText::with_capacity(4);
        text.push(b"ab");
        text.push(b"");
        text.push_digest(b"<image:", b"data");
        text.push(b"cd");
        let bytes = text.to_vec();
        assert_eq!(text.len(), bytes.len());
        assert!(bytes.starts_with(b"ab<image:"));
        assert!(bytes.ends_with(b">cd"));
        assert_eq!(text.parts().len(), 3);
    }

    #[test]
    fn digest_is_stable_and_data_dependent() {
        let mut a = RoutingText::default();
        let mut b = RoutingText::default();
        a.push_digest(b"<file:", b"x");
        b.push_digest(b"<file:", b"x");
        assert_eq!(a.to_vec(), b.to_vec());
        let mut c = RoutingText::default();
        c.push_digest(b"<file:", b"y");
        assert_ne!(a.to_vec(), c.to_vec());
    }

    #[test]
    fn anchor_is_first_mark_or_whole_text() {
        let mut text = RoutingText::default();
        text.push(b"hello");
        assert_eq!(text.anchor_len(), 5);
        text.mark_anchor();
        text.push(b" world");
        text.mark_anchor();
        assert_eq!(text.anchor_len(), 5);
    }

    #[test]
    fn insert_keeps_order_length_and_anchor() {
        let mut text = RoutingText::default();
        let start = text.mark();
        text.push(b"user text");
        text.mark_anchor();
        text.push(b" more");
        text.insert(start, &[b"<", b"", b"role>"]);
        assert_eq!(text.to_vec(), b"<role>user text more");
        assert_eq!(text.len(), 20);
        assert_eq!(text.anchor_len(), 15);
    }

    #[test]
    fn prefix_walk_stops_at_limit() {
        let mut text = RoutingText::default();
        text.push(b"abc");
        text.push(b"def");
        let mut seen = Vec::new();
        text.for_each_prefix(4, |b| seen.extend_from_slice(b));
        assert_eq!(seen, b"abcd");
    }
}
