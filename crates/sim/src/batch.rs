//! vLLM's engine steps: every step computes, in the order the requests were admitted, a
//! token of each decoding request and chunks of the prompts still prefilling, up to a
//! budget of tokens (vLLM's `--max-num-batched-tokens`, chunked prefill). A step takes a
//! fixed time plus its prefill work at the engine's throughput, so a long prefill slows
//! every decode beside it, and prefills queue behind each other, as on vLLM.
//!
//! For: the engine's timing when [`Timing::max_num_batched_tokens`] is set. Pure and
//! synchronous, on the simulated clock; the engine admits, caches and reports.
//! Not for: admission or blocks (see `engine` and `cache`).

use super::engine::Timing;

/// A request's progress through the steps.
#[derive(Debug)]
struct Progress {
    id: u64,
    /// Prompt tokens computed or cached so far.
    computed: usize,
    /// Its prompt's length, tokens.
    prompt: usize,
    /// Whether it may be scheduled (its overhead and transfer are over, and, once
    /// prefilled, its first token is out).
    ready: bool,
    /// Output tokens still to produce after the first; `None` while prefilling.
    decoding: Option<usize>,
}

/// What one step computes for one request.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    id: u64,
    /// Prompt tokens computed; 0 for a decode token.
    prompt_tokens: usize,
}

/// The step under way.
#[derive(Debug)]
struct Step {
    /// When it ends, simulated seconds.
    end: f64,
    /// What it computes, in admission order.
    chunks: Vec<Chunk>,
}

/// What the end of a step did to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stepped {
    /// Its prompt is computed: its first token is out once no block it hit is still
    /// being computed by another request.
    Prefilled(u64),
    /// Its last token is out.
    Done(u64),
}

/// The requests running on one engine, in admission order, and the step under way.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    order: Vec<Progress>,
    current: Option<Step>,
}

impl Steps {
    /// Adds a request admitted now with `cached` of its `prompt` tokens already computed
    /// (its last token is always computed, as vLLM's); not scheduled until [`Self::ready`].
    pub(crate) fn admit(&mut self, id: u64, cached: usize, prompt: usize) {
        self.order.push(Progress {
            id,
            computed: cached.min(prompt.saturating_sub(1)),
            prompt,
            ready: false,
            decoding: None,
        });
    }

    /// Lets `id` be scheduled: its prefill from the next step on.
    pub(crate) fn ready(&mut self, id: u64) {
        if let Some(p) = self.find(id) {
            p.ready = true;
        }
    }

    /// `id`'s first token is out: it decodes `left` more tokens, one a step.
    pub(crate) fn decode(&mut self, id: u64, left: usize) {
        if let Some(p) = self.find(id) {
            p.decoding = Some(left);
            p.ready = true;
        }
    }

    /// Forgets `id`; returns the prompt tokens it had computed (cached included) by the
    /// last step that ended.
    pub(crate) fn remove(&mut self, id: u64) -> usize {
        if let Some(step) = &mut self.current {
            step.chunks.retain(|c| c.id != id);
        }
        let at = self.order.iter().position(|p| p.id == id);
        at.map_or(0, |at| self.order.remove(at).computed)
    }

    /// When the step under way ends, if one is.
    pub(crate) fn next_end(&self) -> Option<f64> {
        self.current.as_ref().map(|step| step.end)
    }

    /// Starts a step at `now` if none is under way and any request can be scheduled: in
    /// admission order, each request takes what it needs of the budget (a token if it
    /// decodes, the rest of its prompt if it prefills) until the budget is spent, so a
    /// request admitted after a long prefill waits for it, as in vLLM's scheduler.
    pub(crate) fn start(&mut self, now: f64, timing: &Timing) {
        if self.current.is_some() {
            return;
        }
        let mut budget = timing.max_num_batched_tokens.max(1);
        let mut chunks = Vec::new();
        let mut work = 0.0;
        for p in self.order.iter().filter(|p| p.ready) {
            if budget == 0 {
                break;
            }
            let prompt_tokens = match p.decoding {
                Some(_) => 0,
                None => (p.prompt - p.computed).min(budget),
            };
            if p.decoding.is_none() && prompt_tokens == 0 {
                continue;
            }
            work += timing.work(p.computed, prompt_tokens);
            budget -= prompt_tokens.max(1);
            chunks.push(Chunk {
                id: p.id,
                prompt_tokens,
            });
        }
        if chunks.is_empty() {
            return;
        }
        let end = now + timing.decode_s_per_token + work / timing.prefill_tokens_per_s;
        self.current = Some(Step { end, chunks });
    }

    /// Ends the step under way (the clock is at its end): what it did, in admission order.
    pub(crate) fn end(&mut self) -> Vec<Stepped> {
        let Some(step) = self.current.take() else {
            return Vec::new();
        };
        let mut stepped = Vec::new();
        for chunk in step.chunks {
            let Some(p) = self.find(chunk.id) else {
                continue;
            };
            match p.decoding.as_mut() {
                Some(left) => {
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        stepped.push(Stepped::Done(chunk.id));
                    }
                }
                None => {
                    p.computed = (p.computed + chunk.prompt_tokens).min(p.prompt);
                    if p.computed == p.prompt {
                        p.ready = false;
                        stepped.push(Stepped::Prefilled(chunk.id));
                    }
                }
            }
        }
        stepped
    }

    fn find(&mut self, id: u64) -> Option<&mut Progress> {
        self.order.iter_mut().find(|p| p.id == id)
    }
}
