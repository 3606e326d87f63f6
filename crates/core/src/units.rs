//! The three sizes the router reasons in, as types, and the one place they convert:
//!
//! - [`TextBytes`]: bytes of routing text (what a request offers, what the index matched);
//! - [`Tokens`]: tokens of a backend's KV cache (what backends publish and report);
//! - [`KeyBytes`]: bytes of the prefix index's keys (what its budgets and LRU count);
//!
//! and [`PromptSize`], a prompt's size as the router knows it: counted in tokens (token
//! mode) or estimated from its routing text (text mode).
//!
//! Routing text is taken at [`TEXT_BYTES_PER_TOKEN`] bytes a token, and the index keeps one
//! [`KEY_BYTES`] hash per [`BLOCK_BYTES`] block of text. A wrong mix is a compile error.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

/// Bytes of routing text per token of a backend's KV cache, to size the index and weigh
/// capacities in the routing text's unit (measured 3.98-4.13 on the lab's workloads:
/// routing text bytes routed over prompt tokens the backends reported).
pub const TEXT_BYTES_PER_TOKEN: usize = 4;

/// Bytes of routing text per block of the index: 16 tokens, a vLLM block.
pub const BLOCK_BYTES: usize = 64;

/// Bytes of index key per block: one 8-byte hash.
pub const KEY_BYTES: usize = 8;

macro_rules! unit {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub usize);

        impl $name {
            /// `self - other`, or zero.
            pub fn saturating_sub(self, other: $name) -> $name {
                $name(self.0.saturating_sub(other.0))
            }
        }

        impl Add for $name {
            type Output = $name;
            fn add(self, other: $name) -> $name {
                $name(self.0.saturating_add(other.0))
            }
        }

        impl AddAssign for $name {
            fn add_assign(&mut self, other: $name) {
                *self = *self + other;
            }
        }

        impl Sum for $name {
            fn sum<I: Iterator<Item = $name>>(iter: I) -> $name {
                iter.fold($name(0), Add::add)
            }
        }
    };
}

unit!(
    /// Bytes of routing text.
    TextBytes
);
unit!(
    /// Tokens of KV cache.
    Tokens
);
unit!(
    /// Bytes of prefix-index keys.
    KeyBytes
);

impl Tokens {
    /// The routing text these tokens stand for.
    pub fn text(self) -> TextBytes {
        TextBytes(self.0.saturating_mul(TEXT_BYTES_PER_TOKEN))
    }

    /// The index keys that remember this many tokens (whole blocks).
    pub fn keys(self) -> KeyBytes {
        KeyBytes(self.text().0 / BLOCK_BYTES * KEY_BYTES)
    }
}

impl TextBytes {
    /// The tokens this text stands for.
    pub fn tokens(self) -> Tokens {
        Tokens(self.0 / TEXT_BYTES_PER_TOKEN)
    }

    /// The index keys that remember this text (whole blocks).
    pub fn keys(self) -> KeyBytes {
        KeyBytes(self.0 / BLOCK_BYTES * KEY_BYTES)
    }

    /// This text rounded down to whole blocks.
    pub fn whole_blocks(self) -> TextBytes {
        TextBytes(self.0 / BLOCK_BYTES * BLOCK_BYTES)
    }
}

impl KeyBytes {
    /// The text these keys index (whole blocks).
    pub fn text(self) -> TextBytes {
        TextBytes(self.0 / KEY_BYTES * BLOCK_BYTES)
    }

    /// The tokens of KV these keys remember.
    pub fn tokens(self) -> Tokens {
        self.text().tokens()
    }
}

/// Bytes of routing text per token of a backend's prompts (text mode): how its tokens
/// convert to the text the router measures. [`TEXT_BYTES_PER_TOKEN`] is
/// `TextPerToken::ASSUMED`; a backend's own is learned (`density`).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct TextPerToken(pub f64);

impl TextPerToken {
    /// What the router assumes until a backend's reports say otherwise.
    pub const ASSUMED: TextPerToken = TextPerToken(TEXT_BYTES_PER_TOKEN as f64);

    /// The routing text `tokens` of the backend's prompts stand for.
    pub fn text(self, tokens: Tokens) -> TextBytes {
        TextBytes((tokens.0 as f64 * self.0) as usize)
    }

    /// The tokens `text` of routing text makes on the backend.
    pub fn tokens(self, text: TextBytes) -> Tokens {
        Tokens((text.0 as f64 / self.0.max(f64::MIN_POSITIVE)) as usize)
    }
}

/// A prompt's size as the router knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptSize {
    /// Counted by the model's tokenizer (token mode).
    Tokens(Tokens),
    /// Its routing text (text mode): tokens only estimated, at [`TEXT_BYTES_PER_TOKEN`].
    Text(TextBytes),
}

impl Default for PromptSize {
    fn default() -> Self {
        PromptSize::Text(TextBytes(0))
    }
}

impl PromptSize {
    /// The size in routing text (tokens at [`TEXT_BYTES_PER_TOKEN`]), the unit the index
    /// and the policies work in.
    pub fn text(self) -> TextBytes {
        match self {
            PromptSize::Tokens(t) => t.text(),
            PromptSize::Text(t) => t,
        }
    }

    /// Its tokens: exact in token mode, estimated in text mode.
    pub fn tokens(self) -> Tokens {
        self.text().tokens()
    }

    /// Whether its tokens are estimated (text mode).
    pub fn estimated(self) -> bool {
        matches!(self, PromptSize::Text(_))
    }

    /// `part` of it (routing text, as the index matched it) and the whole, in the unit the
    /// prompt was measured in, with that unit's name: tokens in token mode, bytes in text
    /// mode.
    pub fn shown(self, part: TextBytes) -> (usize, usize, &'static str) {
        match self {
            PromptSize::Tokens(t) => (part.tokens().0, t.0, "tokens"),
            PromptSize::Text(t) => (part.0, t.0, "bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_on_whole_blocks() {
        let tokens = Tokens(1 << 20);
        assert_eq!(tokens.keys(), KeyBytes(512 << 10));
        assert_eq!(tokens.keys().tokens(), tokens);
        assert_eq!(tokens.text(), TextBytes(4 << 20));
        assert_eq!(TextBytes(130).whole_blocks(), TextBytes(128));
        assert_eq!(KeyBytes(16).text(), TextBytes(128));
        assert_eq!(Tokens(15).keys(), KeyBytes(0), "less than a block");
    }

    #[test]
    fn a_prompt_is_shown_in_the_unit_it_was_measured_in() {
        let counted = PromptSize::Tokens(Tokens(100));
        assert_eq!(counted.shown(TextBytes(256)), (64, 100, "tokens"));
        assert_eq!(
            (counted.text(), counted.estimated()),
            (TextBytes(400), false)
        );
        let text = PromptSize::Text(TextBytes(400));
        assert_eq!(text.shown(TextBytes(256)), (256, 400, "bytes"));
        assert_eq!((text.tokens(), text.estimated()), (Tokens(100), true));
    }
}
