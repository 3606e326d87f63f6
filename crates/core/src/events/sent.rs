//! Prompts the router sent to publishing backends and that have no answer yet. An engine
//! publishes a prompt's blocks only as it computes them (vLLM 0.32 caches a block when it
//! allocates it to a scheduled chunk; the simulator does the same), so a prompt still in
//! the engine's queue or being prefilled is in no record yet: a second conversation on
//! the same prompt, sent meanwhile, would compute it again elsewhere. Until its first
//! response byte, by which time the engine has published its blocks, the router counts
//! what it sent as held beside what the record says. Past that the record alone speaks,
//! preemptions and evictions included.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::held::BLOCK_TOKENS;
use crate::BackendId;
use crate::units::Tokens;
use parking_lot::Mutex;
use smallvec::SmallVec;

/// The prompts without an answer on publishing backends, as chains of block hashes (one
/// per 16 tokens).
#[derive(Debug, Default)]
pub struct Sent {
    prompts: Mutex<Vec<Prompt>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Prompt {
    id: u64,
    backend: BackendId,
    chain: Box<[[u8; 8]]>,
}

/// A prompt sent to a backend, counted there until dropped (when its request is answered
/// or ends).
#[derive(Debug)]
pub struct SentPrompt {
    sent: Arc<Sent>,
    id: u64,
}

impl Sent {
    /// Counts the prompt of `chain` on `backend` until the returned guard is dropped.
    pub fn add(self: &Arc<Self>, backend: BackendId, chain: &[[u8; 8]]) -> SentPrompt {
        let id = self.next.fetch_add(1, Relaxed);
        let chain = chain.into();
        self.prompts.lock().push(Prompt { id, backend, chain });
        SentPrompt {
            sent: Arc::clone(self),
            id,
        }
    }

    /// For each backend with prompts counted, the most leading tokens of the prompt of
    /// `chain` one of them shares, in whole blocks of the chain.
    pub fn matched(&self, chain: &[[u8; 8]]) -> SmallVec<[(BackendId, Tokens); 8]> {
        let mut out: SmallVec<[(BackendId, Tokens); 8]> = SmallVec::new();
        for prompt in self.prompts.lock().iter() {
            let blocks = (prompt.chain.iter().zip(chain))
                .take_while(|(a, b)| a == b)
                .count();
            let shared = Tokens(blocks * BLOCK_TOKENS);
            match out.iter_mut().find(|(b, _)| *b == prompt.backend) {
                Some((_, most)) => *most = (*most).max(shared),
                None => out.push((prompt.backend, shared)),
            }
        }
        out
    }

    /// What of the prompt of `chain` `backend` holds by `recorded` (its record), or by a
    /// prompt counted there that `unanswered` ([`Sent::matched`]) shows, whichever is more.
    pub fn held(
        recorded: Tokens,
        unanswered: &[(BackendId, Tokens)],
        backend: BackendId,
    ) -> Tokens {
        let sent = unanswered.iter().find(|(b, _)| *b == backend);
        recorded.max(sent.map_or(Tokens(0), |s| s.1))
    }
}

impl Drop for SentPrompt {
    fn drop(&mut self) {
        let mut prompts = self.sent.prompts.lock();
        if let Some(i) = prompts.iter().position(|p| p.id == self.id) {
            prompts.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_counts_on_its_backend_until_dropped() {
        let sent = Arc::new(Sent::default());
        let matched = |chain: &[[u8; 8]]| {
            let mut by_backend = sent.matched(chain).into_vec();
            by_backend.sort();
            by_backend
        };
        let (a, b) = (BackendId(0), BackendId(1));
        let prompt = [[1; 8], [2; 8], [3; 8]];
        let first = sent.add(a, &prompt);
        let other = sent.add(a, &prompt[..1]);
        let next_turn = [[1; 8], [2; 8], [3; 8], [4; 8]];
        let blocks = |n| Tokens(n * BLOCK_TOKENS);
        assert_eq!(matched(&next_turn), [(a, blocks(3))]);
        assert_eq!(matched(&[[9; 8]]), [(a, blocks(0))]);
        let _on_b = sent.add(b, &[[1; 8], [7; 8]]);
        assert_eq!(matched(&next_turn), [(a, blocks(3)), (b, blocks(1))]);
        drop(first);
        assert_eq!(matched(&next_turn), [(a, blocks(1)), (b, blocks(1))]);
        drop(other);
        assert_eq!(matched(&next_turn), [(b, blocks(1))]);
        assert_eq!(Sent::held(blocks(2), &matched(&next_turn), b), blocks(2));
        assert_eq!(Sent::held(blocks(0), &matched(&next_turn), b), blocks(1));
        assert_eq!(Sent::held(blocks(0), &matched(&next_turn), a), blocks(0));
    }
}
