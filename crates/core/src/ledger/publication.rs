//! What a backend published of itself: its KV capacity, block size and sequences, its
//! load (running, waiting, KV usage), and the routing text per token its reports taught.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::density::Density;
use crate::policy::Published;
use crate::units::{TextBytes, TextPerToken, Tokens};

/// One backend's published description; each value 0 (or, for the load, absent) until it
/// says.
#[derive(Debug)]
pub(super) struct Publication {
    /// KV tokens; 0 when unknown.
    capacity: AtomicUsize,
    /// Tokens per KV block; 0 when unknown.
    block: AtomicUsize,
    /// Bytes of routing text per token of its prompts, as its reports taught.
    density: Density,
    /// The capacity its index budget was last sized from, as routing text.
    sized: AtomicUsize,
    /// Sequences whose KV it keeps at once (slots); 0 when unknown.
    sequences: AtomicUsize,
    /// Running is `usize::MAX` until it published its load.
    running: AtomicUsize,
    waiting: AtomicUsize,
    kv_usage: AtomicU64,
}

impl Default for Publication {
    fn default() -> Self {
        Publication {
            capacity: AtomicUsize::new(0),
            block: AtomicUsize::new(0),
            density: Density::default(),
            sized: AtomicUsize::new(0),
            sequences: AtomicUsize::new(0),
            running: AtomicUsize::new(usize::MAX),
            waiting: AtomicUsize::new(0),
            kv_usage: AtomicU64::new(0),
        }
    }
}

impl Publication {
    pub fn capacity(&self) -> Option<Tokens> {
        Some(Tokens(self.capacity.load(Relaxed))).filter(|t| t.0 > 0)
    }

    pub fn set_capacity(&self, capacity: Option<Tokens>) {
        self.capacity.store(capacity.map_or(0, |t| t.0), Relaxed);
    }

    pub fn density(&self) -> TextPerToken {
        self.density.get()
    }

    /// Learns the density from a request of `routed` text the backend counted as `prompt`.
    pub fn learn_density(&self, routed: TextBytes, prompt: Tokens) {
        self.density.learn(routed, prompt);
    }

    pub fn block(&self) -> Option<Tokens> {
        Some(Tokens(self.block.load(Relaxed))).filter(|t| t.0 > 0)
    }

    pub fn set_block(&self, block: Option<Tokens>) {
        self.block.store(block.map_or(0, |t| t.0), Relaxed);
    }

    pub fn sequences(&self) -> Option<usize> {
        Some(self.sequences.load(Relaxed)).filter(|&n| n > 0)
    }

    pub fn set_sequences(&self, sequences: Option<usize>) {
        self.sequences.store(sequences.unwrap_or(0), Relaxed);
    }

    pub fn load(&self) -> Option<Published> {
        let running = self.running.load(Relaxed);
        (running != usize::MAX).then(|| Published {
            running,
            waiting: self.waiting.load(Relaxed),
            kv_usage: f64::from_bits(self.kv_usage.load(Relaxed)),
        })
    }

    pub fn set_load(&self, published: Option<Published>) {
        let Some(p) = published else {
            self.running.store(usize::MAX, Relaxed);
            return;
        };
        self.waiting.store(p.waiting, Relaxed);
        self.kv_usage.store(p.kv_usage.to_bits(), Relaxed);
        self.running.store(p.running.min(usize::MAX - 1), Relaxed);
    }

    /// The capacity to size its index budget from, as routing text at its density, when it
    /// changed since last asked (a density drifting by under 1/32 changes nothing):
    /// `Some(None)` for the configured budget (capacity unknown).
    pub fn budget_change(&self) -> Option<Option<TextBytes>> {
        let text = self.capacity().map(|c| self.density().text(c));
        let now = text.map_or(0, |t| t.0);
        let before = self.sized.load(Relaxed);
        let moved = now.abs_diff(before) > before / 32 || (now == 0) != (before == 0);
        moved.then(|| {
            self.sized.store(now, Relaxed);
            text
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_known_until_published_and_the_budget_changes_once_per_capacity() {
        let p = Publication::default();
        assert_eq!(
            (p.capacity(), p.block(), p.sequences(), p.load()),
            (None, None, None, None)
        );
        assert_eq!(p.budget_change(), None, "still the configured budget");
        p.set_capacity(Some(Tokens(1_000)));
        assert!(matches!(p.budget_change(), Some(Some(_))));
        assert_eq!(p.budget_change(), None, "asked again: unchanged");
        let load = Published {
            running: 3,
            waiting: 1,
            kv_usage: 0.25,
        };
        p.set_load(Some(load));
        assert_eq!(p.load().map(|l| (l.running, l.waiting)), Some((3, 1)));
        p.set_load(None);
        assert!(p.load().is_none());
        p.set_capacity(None);
        assert_eq!(p.budget_change(), Some(None));
    }
}
