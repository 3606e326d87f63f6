//! The scheduler and timing model of one simulated vLLM instance, on a simulated clock.
//!
//! For: deciding when each request is admitted, when its first token is out and
//! when it finishes, in *simulated* seconds, given the block cache. Pure and
//! synchronous: the caller feeds it the current simulated time ([`EngineCore::advance`])
//! and asks when it next needs waking ([`EngineCore::next_deadline`]), so tests can
//! assert exact simulated times without a wall clock.
//! Not for: real time, channels or HTTP (see `driver`), nor parsing requests.
//!
//! Model:
//! - Requests wait in a FIFO queue. The head is admitted when fewer than
//!   `max_num_seqs` requests run and the cache can hold its blocks (its hit plus
//!   new blocks for the rest of the prompt and *all* `output_tokens`, reserved
//!   upfront, so a running request never needs preempting). The head blocks the
//!   queue until it fits, like vLLM's FCFS scheduler.
//! - An admitted request first waits `prefill_overhead_s` (not shared), then
//!   prefills its uncached tokens. Prefill is processor sharing: all requests
//!   prefilling at a moment split `prefill_tokens_per_s` equally. Alone, a request
//!   takes `overhead + uncached / prefill_tokens_per_s`.
//! - With `attention_tokens` L > 0, a token at position p of the prompt costs `1 + p / L`
//!   tokens of that throughput: attending to the context before it grows with p, and at
//!   p = L it costs as much as the rest of the token's compute. A prefill of the
//!   positions c..n is then `(n - c) + (n² - c²) / 2L` tokens of work, so a short turn
//!   at the end of a long cached context still takes time.
//! - A request that hit blocks another request is still prefilling (they are cached
//!   from that request's admission on, as vLLM caches a block once the step computing it
//!   is scheduled) does not compute them again, but its first token waits for them: it
//!   is out when its own prefill and theirs have ended.
//! - The decode leg of a disaggregated request ([`EngineRequest::remote_blocks`]) loads
//!   the blocks a remote prefill computed that its hit lacks, `transfer_s_per_block`
//!   each, after its overhead and before prefilling the rest (its last token at least);
//!   they count as cached, as vLLM reports them.
//! - Its first output token is out when its prefill ends; each further one every
//!   `decode_s_per_token` (independent of load). It finishes with its last token,
//!   releasing its blocks to the cache.
//! - With `max_num_batched_tokens` set, prefill and decode share vLLM's engine steps
//!   instead (see `batch`): a step of `decode_s_per_token` plus its prefill work computes
//!   a token of every decoding request and, in admission order, chunks of the prompts
//!   still prefilling, up to that many tokens.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::batch::{Stepped, Steps};
use super::cache::{Allocation, BlockCache, BlockHash, Change, max_hit_blocks};

/// Remaining prefill below this many tokens counts as done (float slack).
const EPS_TOKENS: f64 = 1e-6;

/// Timing and scheduling parameters, in simulated seconds.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Prefill throughput shared by all prefilling requests, tokens per second (of
    /// tokens at position 0 when `attention_tokens` is set).
    pub prefill_tokens_per_s: f64,
    /// The position, in tokens, at which attending to the context doubles a prefilled
    /// token's cost; 0 for none (every token costs the same).
    pub attention_tokens: f64,
    /// Fixed latency each request pays before its prefill, seconds.
    pub prefill_overhead_s: f64,
    /// Interval between output tokens after the first, seconds; with
    /// `max_num_batched_tokens`, the time of a step that prefills nothing.
    pub decode_s_per_token: f64,
    /// Most tokens one engine step computes (vLLM's `--max-num-batched-tokens`); 0 for
    /// none: prefills share the throughput continuously and decode runs beside them.
    pub max_num_batched_tokens: usize,
    /// Most requests running (prefilling or decoding) at once.
    pub max_num_seqs: usize,
    /// Tokens per KV block.
    pub block_tokens: usize,
    /// Time to load one block a remote prefill computed (a disaggregated request's decode
    /// leg), seconds.
    pub transfer_s_per_block: f64,
    /// The order waiting requests are admitted in (vLLM's `--scheduling-policy`).
    pub scheduling: Scheduling,
}

/// The order waiting requests are admitted in, as vLLM's `--scheduling-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheduling {
    /// First come, first served; a request's priority is ignored (vLLM's default).
    #[default]
    Fcfs,
    /// The lowest [`EngineRequest::priority`] first, then the earliest arrival. As in
    /// vLLM, a waiting request never stops a running one for its seat.
    Priority,
}

/// A request handed to the engine, already rendered and hashed.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    /// Unique id (the caller's).
    pub id: u64,
    /// Chained hashes of the prompt's full blocks.
    pub hashes: Vec<BlockHash>,
    /// Prompt length in tokens (>= 1).
    pub prompt_tokens: usize,
    /// Output tokens to generate (>= 1).
    pub output_tokens: usize,
    /// The prompt's token ids, for KV events; empty when the engine publishes none.
    pub token_ids: Vec<u32>,
    /// Its priority, lower first (vLLM's `priority` field or `X-Vllm-Priority` header;
    /// default 0); only [`Scheduling::Priority`] reads it.
    pub priority: i64,
    /// Blocks of its prompt a remote prefill computed (a disaggregated request's decode
    /// leg, by its `kv_transfer_params`): those the cache lacks are loaded, at
    /// [`Timing::transfer_s_per_block`] each, instead of computed. 0 for none.
    pub remote_blocks: usize,
}

/// What happened to a request, at simulated time `at` (seconds).
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Admitted: it now runs, with `cached_tokens` of its prompt hit in the cache.
    Admitted {
        id: u64,
        at: f64,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// Its first token is out; `ttft` counts from arrival, queueing included.
    FirstToken {
        id: u64,
        at: f64,
        ttft: f64,
        cached_tokens: usize,
    },
    /// Its last token is out and its blocks are released.
    Finished {
        id: u64,
        at: f64,
        output_tokens: usize,
    },
    /// It needs more blocks than the whole cache has; it never runs.
    Rejected { id: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EnginePhase {
    Overhead,
    Prefill,
    Decode,
}

#[derive(Debug)]
struct RunningRequest {
    allocation: Allocation,
    uncached_tokens: usize,
    cached_tokens: usize,
    output_tokens: usize,
    arrival: f64,
    /// When it was admitted (simulated seconds).
    admitted: f64,
    /// The most requests prefilling at once while it prefilled, itself included.
    beside: usize,
    phase: EnginePhase,
}

/// One instance's queue, running set, prefill sharing and block cache.
#[derive(Debug)]
pub struct EngineCore {
    timing: Timing,
    cache: BlockCache,
    clock: f64,
    waiting: VecDeque<(EngineRequest, f64)>,
    running: HashMap<u64, RunningRequest>,
    /// Requests prefilling now, with their remaining tokens as of `clock`.
    prefilling: Vec<(u64, f64)>,
    /// Requests whose prefill ended while a block they hit is still being computed.
    blocked: Vec<u64>,
    /// Wake-ups `(at.to_bits(), id)`: the end of a request's overhead or its last
    /// token, by its phase. Times are >= 0, and the bits of non-negative floats
    /// order like the floats.
    timers: BinaryHeap<Reverse<(u64, u64)>>,
    outputs: Vec<Output>,
    /// Cache changes with their token ids, when the engine publishes KV events.
    changes: Vec<Change>,
    /// The engine's steps, with `max_num_batched_tokens` set.
    steps: Option<Steps>,
}

impl EngineCore {
    /// An idle engine at simulated time 0 with a cache of `kv_blocks` blocks.
    pub fn new(timing: Timing, kv_blocks: usize) -> Self {
        Self {
            steps: (timing.max_num_batched_tokens > 0).then(Steps::default),
            timing,
            cache: BlockCache::new(kv_blocks),
            clock: 0.0,
            waiting: VecDeque::new(),
            running: HashMap::new(),
            prefilling: Vec::new(),
            blocked: Vec::new(),
            timers: BinaryHeap::new(),
            outputs: Vec::new(),
            changes: Vec::new(),
        }
    }

    /// The simulated time the engine has reached, seconds.
    pub fn now(&self) -> f64 {
        self.clock
    }

    /// Requests waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests admitted and not finished.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The timing parameters.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The block cache (read-only).
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Forgets the whole prefix cache (see [`BlockCache::forget_all`]).
    pub fn forget_cache(&mut self) {
        self.cache.forget_all();
        self.changes.extend(self.cache.take_changes());
    }

    /// Starts keeping the cache's changes for KV events ([`Self::take_changes`]).
    pub fn publish_changes(&mut self) {
        self.cache.log_changes();
    }

    /// The cache's changes since the last call, stores with their token ids.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Blocks a request holds while running: prompt plus output tokens, rounded up to blocks.
    pub fn blocks_needed(&self, prompt_tokens: usize, output_tokens: usize) -> usize {
        prompt_tokens
            .saturating_add(output_tokens)
            .div_ceil(self.timing.block_tokens.max(1))
    }

    /// Takes the outputs produced since the last call, in order.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Queues a request arriving now (call [`Self::advance`] to the arrival time first).
    pub fn submit(&mut self, request: EngineRequest) {
        self.waiting.push_back((request, self.clock));
        self.admit();
        self.start_step();
    }

    /// Drops a request wherever it is (client gone); its blocks are released, and only
    /// those its prefill computed stay cached. Unknown or finished ids are ignored.
    pub fn abort(&mut self, id: u64) {
        if let Some(running) = self.running.remove(&id) {
            let computed = self.computed_tokens(id, &running) / self.timing.block_tokens.max(1);
            self.prefilling.retain(|&(other, _)| other != id);
            self.blocked.retain(|&other| other != id);
            self.cache.release_computed(running.allocation, computed);
            self.unblock();
        } else {
            self.waiting.retain(|(request, _)| request.id != id);
        }
        self.admit();
        self.start_step();
    }

    /// The prompt tokens `running` (just taken out as `id`) has computed or hit.
    fn computed_tokens(&mut self, id: u64, running: &RunningRequest) -> usize {
        let (cached, uncached) = (running.cached_tokens, running.uncached_tokens);
        let prompt = cached + uncached;
        if let Some(steps) = &mut self.steps {
            return steps.remove(id);
        }
        let uncomputed = match running.phase {
            EnginePhase::Overhead => uncached,
            EnginePhase::Prefill => {
                let left = (self.prefilling.iter().find(|&&(other, _)| other == id))
                    .map_or(0.0, |&(_, left)| left);
                let done = (self.timing.work(cached, uncached) - left).max(0.0);
                uncached.saturating_sub(self.timing.tokens_of(cached, done) as usize)
            }
            EnginePhase::Decode => 0,
        };
        prompt.saturating_sub(uncomputed)
    }

    /// The simulated time of the next event, if any: a prefill ending, an overhead
    /// ending or a request finishing.
    pub fn next_deadline(&self) -> Option<f64> {
        let timer = self
            .timers
            .peek()
            .map(|&Reverse((at, _))| f64::from_bits(at));
        let compute = match &self.steps {
            Some(steps) => steps.next_end(),
            None => self.next_prefill_end(),
        };
        match (timer, compute) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Processes every event up to simulated time `now` (seconds), in time order.
    pub fn advance(&mut self, now: f64) {
        while let Some(at) = self.next_deadline() {
            if at > now {
                break;
            }
            self.step(at);
        }
        self.set_clock(now);
    }

    fn next_prefill_end(&self) -> Option<f64> {
        let least = self
            .prefilling
            .iter()
            .map(|&(_, left)| left)
            .min_by(f64::total_cmp)?;
        let share = self.timing.prefill_tokens_per_s / self.prefilling.len() as f64;
        Some(self.clock + least.max(0.0) / share)
    }

    /// Moves the clock forward, progressing every prefill by its share of the throughput.
    fn set_clock(&mut self, t: f64) {
        if t <= self.clock {
            return;
        }
        if !self.prefilling.is_empty() {
            let share = self.timing.prefill_tokens_per_s / self.prefilling.len() as f64;
            let done = (t - self.clock) * share;
            for (_, left) in &mut self.prefilling {
                *left = (*left - done).max(0.0);
            }
        }
        self.clock = t;
    }

    fn step(&mut self, at: f64) {
        let prefill_due = self.next_prefill_end().is_some_and(|end| end <= at);
        let step_due = (self.steps.as_ref()).is_some_and(|s| s.next_end().is_some_and(|e| e <= at));
        self.set_clock(at);
        if prefill_due {
            self.end_prefills();
        }
        if step_due {
            self.end_step();
        }
        while self
            .timers
            .peek()
            .is_some_and(|&Reverse((due, _))| f64::from_bits(due) <= at)
        {
            if let Some(Reverse((_, id))) = self.timers.pop() {
                self.fire(id);
            }
        }
        self.admit();
        self.start_step();
    }

    /// Ends the engine step under way: prefilled requests wait for their blocks as in
    /// [`Self::end_prefills`], and those with their last token finish.
    fn end_step(&mut self) {
        let stepped = (self.steps.as_mut()).map(Steps::end).unwrap_or_default();
        for event in stepped {
            match event {
                Stepped::Prefilled(id) => self.blocked.push(id),
                Stepped::Done(id) => self.finish(id),
            }
        }
        self.unblock();
    }

    /// Starts the next engine step, if the engine steps and is idle with work to do.
    fn start_step(&mut self) {
        if let Some(steps) = &mut self.steps {
            steps.start(self.clock, &self.timing);
        }
    }

    /// Ends the prefill that was due (the least remaining, whatever float error left
    /// of it) and any other that is done.
    fn end_prefills(&mut self) {
        let least = self
            .prefilling
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.1.total_cmp(&b.1.1))
            .map(|(index, _)| index);
        if let Some(index) = least {
            self.prefilling[index].1 = 0.0;
        }
        let mut done = Vec::new();
        self.prefilling.retain(|&(id, left)| {
            let finished = left <= EPS_TOKENS;
            if finished {
                done.push(id);
            }
            !finished
        });
        self.blocked.extend(done);
        self.unblock();
    }

    /// Gives their first token to the requests whose prefill ended and which no longer
    /// wait for a block they hit; the others stay blocked.
    fn unblock(&mut self) {
        let cache = &self.cache;
        let running = &self.running;
        let (ready, blocked): (Vec<u64>, Vec<u64>) = (self.blocked.iter())
            .partition(|id| (running.get(id)).is_none_or(|r| !cache.waits(&r.allocation)));
        self.blocked = blocked;
        for id in ready {
            self.first_token(id);
        }
    }

    fn fire(&mut self, id: u64) {
        let Some(running) = self.running.get_mut(&id) else {
            return;
        };
        match running.phase {
            EnginePhase::Overhead => {
                running.phase = EnginePhase::Prefill;
                let work = self
                    .timing
                    .work(running.cached_tokens, running.uncached_tokens);
                match &mut self.steps {
                    Some(steps) => steps.ready(id),
                    None => self.prefill(id, work),
                }
            }
            EnginePhase::Decode => self.finish(id),
            EnginePhase::Prefill => {}
        }
    }

    /// Starts `id`'s prefill of `work` tokens beside those prefilling now.
    fn prefill(&mut self, id: u64, work: f64) {
        self.prefilling.push((id, work));
        let now = self.prefilling.len();
        for (other, _) in &self.prefilling {
            if let Some(r) = self.running.get_mut(other) {
                r.beside = r.beside.max(now);
            }
        }
    }

    fn first_token(&mut self, id: u64) {
        let Some(running) = self.running.get_mut(&id) else {
            return;
        };
        running.phase = EnginePhase::Decode;
        self.cache.computed(&running.allocation);
        let (at, output_tokens) = (self.clock, running.output_tokens);
        let (ttft, cached_tokens) = (at - running.arrival, running.cached_tokens);
        log::debug!(
            "request {id}: {} of {} tokens cached, queued {:.3} s, prefilled {:.3} s \
             beside up to {} others",
            cached_tokens,
            cached_tokens + running.uncached_tokens,
            running.admitted - running.arrival,
            at - running.admitted,
            running.beside.saturating_sub(1),
        );
        self.outputs.push(Output::FirstToken {
            id,
            at,
            ttft,
            cached_tokens,
        });
        if output_tokens <= 1 {
            self.finish(id);
        } else if let Some(steps) = &mut self.steps {
            steps.decode(id, output_tokens - 1);
        } else {
            let at = at + (output_tokens - 1) as f64 * self.timing.decode_s_per_token;
            self.timers.push(Reverse((at.max(0.0).to_bits(), id)));
        }
        self.unblock();
    }

    fn finish(&mut self, id: u64) {
        if let Some(running) = self.running.remove(&id) {
            let output_tokens = running.output_tokens;
            if let Some(steps) = &mut self.steps {
                steps.remove(id);
            }
            self.cache.release(running.allocation);
            self.outputs.push(Output::Finished {
                id,
                at: self.clock,
                output_tokens,
            });
        }
    }

    /// The waiting request admitted next: the first in line, or with
    /// [`Scheduling::Priority`] the first of the lowest priority value.
    fn next_waiting(&self) -> Option<usize> {
        match self.timing.scheduling {
            Scheduling::Fcfs => (!self.waiting.is_empty()).then_some(0),
            Scheduling::Priority => (self.waiting.iter().enumerate())
                .min_by_key(|(i, (request, _))| (request.priority, *i))
                .map(|(i, _)| i),
        }
    }

    /// Admits waiting requests in their order while a seat and the blocks are available.
    fn admit(&mut self) {
        while self.running.len() < self.timing.max_num_seqs.max(1) {
            let Some(next) = self.next_waiting() else {
                return;
            };
            let request = &self.waiting[next].0;
            let total = self.blocks_needed(request.prompt_tokens, request.output_tokens);
            if total > self.cache.capacity() {
                let id = request.id;
                self.waiting.remove(next);
                self.outputs.push(Output::Rejected { id });
                continue;
            }
            let cap = max_hit_blocks(
                request.prompt_tokens,
                request.hashes.len(),
                self.timing.block_tokens,
            );
            let Some(allocation) = self.cache.allocate(&request.hashes, cap, total) else {
                return;
            };
            let block = self.timing.block_tokens;
            for mut change in self.cache.take_changes() {
                if let Change::Stored {
                    hashes,
                    first,
                    token_ids,
                    ..
                } = &mut change
                {
                    let ids = request
                        .token_ids
                        .get(*first * block..(*first + hashes.len()) * block);
                    *token_ids = ids.unwrap_or_default().to_vec();
                }
                self.changes.push(change);
            }
            if let Some((request, arrival)) = self.waiting.remove(next) {
                self.start(request, arrival, allocation);
            }
        }
    }

    /// Runs `request`: its overhead, the load of the blocks a remote prefill computed that
    /// its allocation did not hit, then the prefill of the rest.
    fn start(&mut self, request: EngineRequest, arrival: f64, allocation: Allocation) {
        let block = self.timing.block_tokens;
        let (hit, prompt) = (allocation.hit_blocks(), request.prompt_tokens);
        let cap = max_hit_blocks(prompt, request.hashes.len(), block);
        let loaded = request.remote_blocks.min(cap).saturating_sub(hit);
        let cached_tokens = ((hit + loaded) * block).min(prompt);
        let uncached_tokens = prompt - cached_tokens;
        let wait =
            self.timing.prefill_overhead_s + loaded as f64 * self.timing.transfer_s_per_block;
        let (id, prompt_tokens, at) = (request.id, request.prompt_tokens, self.clock);
        self.outputs.push(Output::Admitted {
            id,
            at,
            prompt_tokens,
            cached_tokens,
        });
        let overhead = wait > 0.0;
        let phase = if overhead {
            EnginePhase::Overhead
        } else {
            EnginePhase::Prefill
        };
        let running = RunningRequest {
            allocation,
            uncached_tokens,
            cached_tokens,
            output_tokens: request.output_tokens,
            arrival,
            admitted: self.clock,
            beside: 0,
            phase,
        };
        self.running.insert(id, running);
        if let Some(steps) = &mut self.steps {
            steps.admit(id, cached_tokens, prompt_tokens);
            if !overhead {
                steps.ready(id);
            }
        }
        if overhead {
            let at = self.clock + wait;
            self.timers.push(Reverse((at.max(0.0).to_bits(), id)));
        } else if self.steps.is_none() {
            self.prefill(id, self.timing.work(cached_tokens, uncached_tokens));
        }
    }
}

impl Timing {
    /// The prefill work, in tokens at position 0, of `tokens` tokens after the first `from`.
    pub(crate) fn work(&self, from: usize, tokens: usize) -> f64 {
        let (from, to) = (from as f64, (from + tokens) as f64);
        let attention = if self.attention_tokens > 0.0 {
            (to * to - from * from) / (2.0 * self.attention_tokens)
        } else {
            0.0
        };
        (to - from) + attention
    }

    /// How many tokens after the first `from` a prefill `work` ([`Self::work`]) computes.
    fn tokens_of(&self, from: usize, work: f64) -> f64 {
        let l = self.attention_tokens;
        if l <= 0.0 {
            return work;
        }
        // t + ((from + t)² - from²) / 2L = work, solved for t >= 0.
        let b = 1.0 + from as f64 / l;
        l * ((b * b + 2.0 * work / l).sqrt() - b)
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
