//! What `/stats` reads back of the router's metrics: per backend and router-wide totals.

use super::{Label, RetryReason, Stats};

/// What `/stats` shows of one backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendTotals {
    /// Requests answered or failed on it.
    pub requests: u64,
    /// Prompt tokens it reported.
    pub prompt_tokens: u64,
    /// Of those, cached.
    pub cached_tokens: u64,
}

/// Router-wide totals for `/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Routing text bytes the chosen backends were believed to hold.
    pub matched_bytes: u64,
    /// Routing text bytes routed.
    pub text_bytes: u64,
    /// Attempts retried on another backend.
    pub retries: u64,
    /// Configuration generation.
    pub generation: i64,
}

impl Stats {
    /// What one backend was sent and reported, for `/stats`.
    pub fn backend_totals(&self, backend: &str) -> BackendTotals {
        let backend = [backend];
        BackendTotals {
            requests: self.backend_requests.with_label_values(&backend).get(),
            prompt_tokens: self.prompt_tokens.with_label_values(&backend).get(),
            cached_tokens: self.cached_tokens.with_label_values(&backend).get(),
        }
    }

    /// Router-wide totals, for `/stats`.
    pub fn totals(&self) -> Totals {
        Totals {
            matched_bytes: self.matched_bytes.get(),
            text_bytes: self.text_bytes.get(),
            retries: RetryReason::ALL
                .iter()
                .map(|r| self.retries.of(*r).get())
                .sum(),
            generation: self.generation.get(),
        }
    }
}
