//! What token mode counts: prompts routed on tokens or (not rendered, by reason) on text,
//! tokens taken from the token cache or tokenized now, and what the cache holds.

use prometheus::{IntCounterVec, IntGauge};

use super::Tokenizing;
use crate::stats::{Counters, Registry, label_set};

label_set! {
    /// Where a prompt's tokens came from.
    enum TokenSource {
        Reused => "reused",
        Tokenized => "tokenized",
    }
}

/// Token mode's metrics.
pub struct TokenMetrics {
    prompts: IntCounterVec,
    tokens: Counters<TokenSource>,
    cache_bytes: IntGauge,
    cache_entries: IntGauge,
}

impl TokenMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let r = registry;
        TokenMetrics {
            prompts: r.counter_vec(
                "prompts_total",
                "Routed prompts of models with a tokenizer, by index mode (tokens, or text \
                 when the body was not rendered) and reason",
                &["mode", "reason"],
            ),
            tokens: r.counters(
                "prompt_tokens_total",
                "Tokens of the prompts the router tokenized, by whether they came from its \
                 token cache or were tokenized now",
                "source",
            ),
            cache_bytes: r.gauge(
                "token_cache_bytes",
                "Bytes the conversations' token cache holds",
            ),
            cache_entries: r.gauge(
                "token_cache_entries",
                "Prompt segments the token cache holds",
            ),
        }
    }

    /// Counts what became of a routed prompt (nothing for a model without a tokenizer).
    pub fn prompt(&self, tokenizing: &Tokenizing) {
        let labels = match tokenizing {
            Tokenizing::Untokenized => return,
            Tokenizing::Tokenized(t) => {
                let reused = t.reused as u64;
                self.tokens.inc_by(TokenSource::Reused, reused);
                self.tokens.inc_by(
                    TokenSource::Tokenized,
                    (t.tokens as u64).saturating_sub(reused),
                );
                ["tokens", "rendered"]
            }
            Tokenizing::Unrendered(why) => ["text", why.label()],
        };
        self.prompts.with_label_values(&labels).inc();
    }

    /// Sets the cache's gauges.
    pub fn set_cache(&self, bytes: usize, entries: usize) {
        self.cache_bytes.set(bytes as i64);
        self.cache_entries.set(entries as i64);
    }
}
