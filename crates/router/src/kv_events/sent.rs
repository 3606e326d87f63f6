//! Prompts the router sent to publishing backends, until their requests end. An engine's
//! record holds a prompt's blocks only once the engine computed them (vLLM publishes a
//! block when it is stored), so a prompt still waiting in the engine's queue, or being
//! computed, shows in no record: a second conversation on the same prompt, sent meanwhile,
//! would compute it again on another engine. On a real vLLM fleet that is what made the
//! first turns of sessions sharing a long prompt slow (docs/BENCHMARKS.md). The engine
//! holds a running request's prompt until it ends (short of a preemption), so until then
//! the router counts what it sent as held, beside what the record says.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use prefix_router_core::BackendId;
use smallvec::SmallVec;

/// The prompts in flight on publishing backends, as chains of block hashes (one per 16
/// tokens).
#[derive(Default)]
pub struct Sent {
    prompts: Mutex<Vec<Prompt>>,
    next: AtomicU64,
}

struct Prompt {
    id: u64,
    backend: BackendId,
    chain: Box<[[u8; 8]]>,
}

/// A prompt sent to a backend, counted there until dropped (when its request ends).
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

    /// For each backend with prompts in flight, the most leading blocks of `chain` one of
    /// them shares.
    pub fn matched(&self, chain: &[[u8; 8]]) -> SmallVec<[(BackendId, usize); 8]> {
        let mut out: SmallVec<[(BackendId, usize); 8]> = SmallVec::new();
        for prompt in self.prompts.lock().iter() {
            let shared = (prompt.chain.iter().zip(chain))
                .take_while(|(a, b)| a == b)
                .count();
            match out.iter_mut().find(|(b, _)| *b == prompt.backend) {
                Some((_, most)) => *most = (*most).max(shared),
                None => out.push((prompt.backend, shared)),
            }
        }
        out
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
    fn a_prompt_counts_on_its_backend_until_its_request_ends() {
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
        assert_eq!(matched(&next_turn), [(a, 3)]);
        assert_eq!(matched(&[[9; 8]]), [(a, 0)]);
        let _on_b = sent.add(b, &[[1; 8], [7; 8]]);
        assert_eq!(matched(&next_turn), [(a, 3), (b, 1)]);
        drop(first);
        assert_eq!(matched(&next_turn), [(a, 1), (b, 1)]);
        drop(other);
        assert_eq!(matched(&next_turn), [(b, 1)]);
    }
}
