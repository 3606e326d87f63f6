//! A backend's load as the router placed it: requests in flight, the prefill they have
//! pending (routing text not expected cached, not answered yet) and their prompt tokens.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::units::{TextBytes, Tokens};

/// Counts of the requests placed on one backend and not finished.
#[derive(Debug, Default)]
pub(super) struct Load {
    inflight: AtomicUsize,
    pending: AtomicUsize,
    tokens: AtomicUsize,
}

impl Load {
    /// Requests in flight.
    pub fn requests(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Routing text placed, expected uncached, not answered yet.
    pub fn pending(&self) -> TextBytes {
        TextBytes(self.pending.load(Relaxed))
    }

    /// Prompt tokens of the requests in flight, as estimated when placed.
    pub fn tokens(&self) -> Tokens {
        Tokens(self.tokens.load(Relaxed))
    }

    /// Counts one more request, of `prefill` text and `tokens`, when `open` says the
    /// load before it has room: check and count are one atomic step, so concurrent
    /// placements never pass a limit.
    pub fn take(&self, open: impl Fn(usize) -> bool, prefill: TextBytes, tokens: Tokens) -> bool {
        let next = |n: usize| open(n).then_some(n + 1);
        if self.inflight.fetch_update(Relaxed, Relaxed, next).is_err() {
            return false;
        }
        self.pending.fetch_add(prefill.0, Relaxed);
        if tokens.0 > 0 {
            self.tokens.fetch_add(tokens.0, Relaxed);
        }
        true
    }

    /// The prefill of `prefill` text is done.
    pub fn answered(&self, prefill: usize) {
        self.pending.fetch_sub(prefill, Relaxed);
    }

    /// A request of `tokens` finished (its prefill already answered).
    pub fn release(&self, tokens: Tokens) {
        self.inflight.fetch_sub(1, Relaxed);
        if tokens.0 > 0 {
            self.tokens.fetch_sub(tokens.0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_until_released_and_its_prefill_until_answered() {
        let load = Load::default();
        assert!(!load.take(|_| false, TextBytes(5), Tokens(3)), "closed");
        assert!(load.take(|n| n < 1, TextBytes(5), Tokens(3)));
        assert!(
            !load.take(|n| n < 1, TextBytes(5), Tokens(3)),
            "at its limit"
        );
        assert_eq!(
            (load.requests(), load.pending(), load.tokens()),
            (1, TextBytes(5), Tokens(3))
        );
        load.answered(5);
        assert_eq!(load.pending(), TextBytes(0));
        load.release(Tokens(3));
        assert_eq!((load.requests(), load.tokens()), (0, Tokens(0)));
    }
}
