//! A [`Seat`]: one placed request, counted on its backend's account from placement until
//! it drops, its prefill (and its prompt, where the backend publishes its KV events) until
//! the backend answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use parking_lot::Mutex;

use super::{Account, Cap};
use crate::events::sent::SentPrompt;
use crate::policy::{Decision, Selector};
use crate::units::{PromptSize, TextBytes, TextPerToken, Tokens};

/// One placed request: in flight on its backend until it drops.
#[derive(Debug)]
pub struct Seat {
    account: Arc<Account>,
    prefill: AtomicUsize,
    /// Its prompt tokens, as estimated when placed ([`Cap::tokens`]).
    tokens: Tokens,
    decision: Decision,
    /// The band it counts in among its backend's requests kept a reserve for, if it does.
    band: Option<usize>,
    /// Whether it is a light flow's request kept a reserve for ([`Cap::top`]).
    top: bool,
    /// Whether it is kept a reserve for and has no answer yet (the prefill guard).
    guarding: AtomicBool,
    /// Its prompt, counted as held by a backend that publishes its KV events until the
    /// backend answers ([`crate::events::sent`]).
    sent: Mutex<Option<SentPrompt>>,
}

/// What a backend reported of one placed request, beside the router's own measure of it.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// The request's size as the router measured it: routing text (text mode) or tokens.
    pub size: PromptSize,
    /// Its prompt tokens, as the backend counted them.
    pub prompt: Tokens,
    /// Of those, found in the backend's prefix cache.
    pub cached: Tokens,
}

impl Seat {
    /// A seat on `account`, already counted there, of `prefill` uncached text.
    pub(super) fn new(
        account: Arc<Account>,
        prefill: TextBytes,
        cap: Cap,
        decision: Decision,
    ) -> Self {
        let band = cap.kept_band();
        Seat {
            account,
            prefill: AtomicUsize::new(prefill.0),
            tokens: cap.tokens,
            decision,
            band,
            top: cap.light(),
            guarding: AtomicBool::new(band.is_some()),
            sent: Mutex::new(None),
        }
    }

    /// Counts its `prompt` as held by its backend until the backend answers.
    pub fn count_sent(&self, prompt: SentPrompt) {
        *self.sent.lock() = Some(prompt);
    }

    /// The account of the backend it is on.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// The decision that placed it.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The backend answered (its first response byte): its prefill is done.
    pub fn answered(&self) {
        self.sent.lock().take();
        let prefill = self.prefill.swap(0, Relaxed);
        self.account.load.answered(prefill);
        if self.band.is_some() && self.guarding.swap(false, Relaxed) {
            self.account.reserve.answered();
            (self.account.on_free)();
        }
    }

    /// The backend reported on it: a text-mode request teaches the backend's density, and
    /// the selector's index learns how the cached tokens compare with what it predicted.
    /// A light flow's request that found under half the context predicted cached, where
    /// the requests in flight have prompts of half the KV or more, marks its context
    /// evicted there ([`protect_kv`](super::protect_kv)).
    pub fn reported(&self, selector: &Selector, report: Report) {
        let Report {
            size,
            prompt,
            cached,
        } = report;
        let account = &self.account;
        let density = match size {
            PromptSize::Text(routed) => {
                account.publication.learn_density(routed, prompt);
                account.density()
            }
            PromptSize::Tokens(_) => TextPerToken::ASSUMED,
        };
        if let Some(index) = selector.index() {
            index.observe(account.id, self.decision.matched, density.text(cached));
        }
        let matched = density.tokens(self.decision.matched);
        let heavy = || {
            let tokens = account.load.tokens().0;
            (account.capacity()).is_some_and(|c| tokens.saturating_mul(2) >= c.0)
        };
        if self.top && cached.0.saturating_mul(2) < matched.0 && heavy() {
            account.guard.evicted();
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.answered();
        self.account.load.release(self.tokens);
        if let Some(band) = self.band {
            self.account.reserve.release(band, self.tokens);
        }
        (self.account.on_free)();
    }
}
