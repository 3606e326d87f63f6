//! The model's own tokens: a chat, completions, responses or Messages body rendered with the model's
//! chat template ([`render`]) as vLLM renders it, tokenized with its tokenizer, and turned
//! into the chain of token-block hashes the prefix index keys on ([`encode`]), tokenizing
//! only the text between special tokens not seen before. Loaded from a Hugging Face
//! tokenizer directory ([`model`]); byte-level BPE tokenizers take a shorter road to the
//! same ids (`fast`).
//!
//! Pure computation: no I/O but reading the model directory once.
#![deny(unsafe_code)]

mod anthropic;
pub mod encode;
mod fast;
pub mod model;
pub mod render;
mod template;

pub use encode::{BLOCK_TOKENS, TokenCache, Tokenized};
pub use model::{Model, ModelError};
pub use render::{Prompt, Unrendered};
