//! The best prefix hit rate any router could reach: one infinite cache that
//! has seen every earlier request.
//!
//! Definition (token-weighted, which reproduces the trace README's "best
//! possible" column: 37.4% conversation, 65.1% synthetic):
//!
//! * a request's prompt is a chain of blocks (trace: one per hash id of
//!   `--block-tokens` tokens, the last one possibly partial; agent workload:
//!   one per chat message, the `tools` array first);
//! * `k` = the number of leading blocks whose whole prefix chain appeared in
//!   an earlier request (a block is identified by its prefix chain; a cut
//!   final block counts as its full block, as the README's hash ids do);
//! * hit tokens = the tokens of those `k` blocks, capped at `prompt - 1`
//!   (an engine always computes at least one prompt token);
//! * bound = Σ hit tokens / Σ prompt tokens, in arrival order.
//!
//! The README's other column, "blocks seen earlier" (36.6% / 64.0%), is the
//! block-count ratio Σ k / Σ blocks, reported here as `blocks_seen_rate`.

use serde::Serialize;

use super::plan::{Plan, PlannedTurn};

/// Result of the bound computation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bound {
    /// Best possible token-weighted prefix hit rate, 0..=1.
    pub hit_rate: f64,
    /// Fraction of blocks whose prefix chain was seen earlier, 0..=1.
    pub blocks_seen_rate: f64,
    /// Requests considered.
    pub requests: u64,
    /// Prompt tokens of those requests (as the workload intends them).
    pub prompt_tokens: u64,
    /// Tokens an infinite cache would have hit.
    pub hit_tokens: u64,
    /// The bound with a finite cache, when `--bound-capacity` was given.
    pub pooled: Option<Pooled>,
}

/// The best hit rate with the fleet's caches pooled into one LRU cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pooled {
    /// Capacity of the pooled cache, tokens.
    pub capacity_tokens: u64,
    /// Best token-weighted hit rate with it, 0..=1.
    pub hit_rate: f64,
}

/// Computes the bound over `turns`, taken in the order given.
pub(crate) fn compute<'a>(plan: &Plan, turns: impl Iterator<Item = &'a PlannedTurn>) -> Bound {
    let mut seen = vec![false; plan.pieces.len()];
    let (mut blocks, mut blocks_seen) = (0u64, 0u64);
    let mut b = Bound::default();
    for turn in turns {
        let (k, hit) = leading_hits(plan, turn, &seen);
        for p in plan.chain(turn) {
            seen[plan.piece_key[p as usize] as usize] = true;
        }
        blocks += plan.chain(turn).count() as u64;
        blocks_seen += k;
        b.requests += 1;
        b.prompt_tokens += turn.prompt_tokens;
        b.hit_tokens += hit.min(turn.prompt_tokens.saturating_sub(1));
    }
    b.hit_rate = ratio(b.hit_tokens, b.prompt_tokens);
    b.blocks_seen_rate = ratio(blocks_seen, blocks);
    b
}

/// The bound over the turns that were sent, `(session, turn)` pairs in the order they were
/// sent (the pooled cache's LRU order depends on it: sessions interleave).
/// With `capacity` tokens, the pooled finite-cache bound is computed too.
pub(crate) fn compute_sent(
    plan: &Plan,
    sent: impl Iterator<Item = (u32, u32)>,
    capacity: Option<u64>,
) -> Bound {
    let mut seen = std::collections::HashSet::new();
    let sent: Vec<(u32, u32)> = sent.filter(|pair| seen.insert(*pair)).collect();
    let turns = sent
        .iter()
        .map(|&(s, t)| &plan.sessions[s as usize].turns[t as usize]);
    let mut bound = compute(plan, turns.clone());
    bound.pooled = capacity.map(|capacity_tokens| Pooled {
        capacity_tokens,
        hit_rate: compute_pooled(plan, turns, capacity_tokens),
    });
    bound
}

/// Number of leading blocks already seen, and the tokens they cover.
fn leading_hits(plan: &Plan, turn: &PlannedTurn, seen: &[bool]) -> (u64, u64) {
    let (mut k, mut tokens) = (0, 0);
    for p in plan.chain(turn) {
        if !seen[plan.piece_key[p as usize] as usize] {
            break;
        }
        k += 1;
        tokens += u64::from(plan.piece_tokens[p as usize]);
    }
    (k, tokens)
}

/// The best hit rate with one LRU cache of `capacity` tokens instead of an infinite one:
/// what a perfect router could reach if the fleet's KV caches were pooled. Each request
/// hits its leading cached blocks (capped at `prompt - 1`), then all its blocks become the
/// most recently used, the earlier ones older, and the least recently used are evicted.
pub(crate) fn compute_pooled<'a>(
    plan: &Plan,
    turns: impl Iterator<Item = &'a PlannedTurn>,
    capacity: u64,
) -> f64 {
    let mut cache = BlockLru::default();
    let (mut hit, mut total) = (0u64, 0u64);
    for turn in turns {
        let mut leading = true;
        let mut tokens = 0;
        for p in plan.chain(turn) {
            let key = plan.piece_key[p as usize];
            leading &= cache.contains(key);
            tokens += if leading {
                u64::from(plan.piece_tokens[p as usize])
            } else {
                0
            };
            cache.touch(key, u64::from(plan.piece_tokens[p as usize]), capacity);
        }
        hit += tokens.min(turn.prompt_tokens.saturating_sub(1));
        total += turn.prompt_tokens;
    }
    ratio(hit, total)
}

/// Block keys in least-recently-used order, with their token sizes.
#[derive(Default)]
struct BlockLru {
    ticks: std::collections::HashMap<u32, (u64, u64)>,
    order: std::collections::BTreeMap<u64, u32>,
    tokens: u64,
    clock: u64,
}

impl BlockLru {
    fn contains(&self, key: u32) -> bool {
        self.ticks.contains_key(&key)
    }

    fn touch(&mut self, key: u32, size: u64, capacity: u64) {
        self.clock += 1;
        match self.ticks.insert(key, (self.clock, size)) {
            Some((old, _)) => drop(self.order.remove(&old)),
            None => self.tokens += size,
        }
        self.order.insert(self.clock, key);
        while self.tokens > capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, size)) = self.ticks.remove(&oldest) {
                self.tokens -= size;
            }
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::super::trace::{TraceRecord, plan_trace};
    use super::{Bound, Plan, compute};

    fn rec(ts: f64, input: u64, ids: &[u64]) -> TraceRecord {
        TraceRecord {
            timestamp_ms: ts,
            input_length: input,
            output_length: 1,
            hash_ids: ids.to_vec(),
            session_id: None,
        }
    }

    /// The bound over the whole of `plan`, in schedule order.
    fn whole(plan: &Plan) -> Bound {
        compute(plan, plan.schedule_order().into_iter())
    }

    #[test]
    fn tiny_trace_bound() {
        // Blocks of 4 tokens, 1 byte per token.
        let recs = vec![
            rec(0.0, 10, &[1, 2, 3]), // nothing seen
            rec(1.0, 10, &[1, 2, 4]), // 2 blocks = 8 tokens
            rec(2.0, 12, &[1, 2, 3]), // all 3 seen (3 was partial): 12 -> cap 11
            rec(3.0, 8, &[5, 2]),     // 2 under another parent: nothing
            rec(4.0, 4, &[1]),        // 4 -> cap 3
        ];
        let plan = plan_trace(recs, 4, 1);
        let b = whole(&plan);
        assert_eq!(b.requests, 5);
        assert_eq!(b.prompt_tokens, 44);
        assert_eq!(b.hit_tokens, 8 + 11 + 3);
        assert!((b.hit_rate - 22.0 / 44.0).abs() < 1e-12);
        // blocks: 3+3+3+2+1 = 12, seen 0+2+3+0+1 = 6
        assert!((b.blocks_seen_rate - 0.5).abs() < 1e-12);
    }

    #[test]
    fn pooled_bound_is_the_infinite_one_when_large_and_less_when_small() {
        let recs = vec![
            rec(0.0, 8, &[1, 2]),
            rec(1.0, 8, &[3, 4]),
            rec(2.0, 8, &[1, 2]), // 2 blocks back: hit with room for 4 blocks
        ];
        let plan = plan_trace(recs, 4, 1);
        let big = super::compute_pooled(&plan, plan.all_turns(), 1000);
        assert!((big - whole(&plan).hit_rate).abs() < 1e-12);
        assert!((big - 7.0 / 24.0).abs() < 1e-12);
        assert_eq!(super::compute_pooled(&plan, plan.all_turns(), 8), 0.0);
    }

    /// Two sessions of two turns, each turn adding one 4-token block; sent interleaved.
    fn two_sessions() -> super::Plan {
        use super::super::plan::{PlannedTurn, Session};
        let mut plan = super::Plan::default();
        let turn = |pieces: Vec<u32>, think_ms| PlannedTurn {
            pieces,
            max_tokens: 1,
            think_ms,
            prompt_tokens: 0,
            overlaps: false,
        };
        let mut sessions = Vec::new();
        for s in 0..2u32 {
            let first = plan.push_piece(format!("s{s}a"), None, 4);
            let second = plan.push_piece(format!("s{s}b"), None, 4);
            let mut turns = vec![turn(vec![first], 0.0), turn(vec![first, second], 10.0)];
            turns[0].prompt_tokens = 5;
            turns[1].prompt_tokens = 9;
            sessions.push(Session {
                id: None,
                start_ms: f64::from(s),
                turns,
            });
        }
        plan.sessions = sessions;
        plan
    }

    // Regression: the pooled bound took turns session after session, so sessions never
    // competed for the pooled cache and the finite bound equalled the infinite one.
    #[test]
    fn pooled_bound_interleaves_sessions_as_sent() {
        let plan = two_sessions();
        let order = plan.schedule_order();
        assert_eq!(order[1].pieces, plan.sessions[1].turns[0].pieces);
        // Room for one block: the other session's first turn evicts it in between.
        assert_eq!(super::compute_pooled(&plan, order.into_iter(), 4), 0.0);
        let session_major = super::compute_pooled(&plan, plan.all_turns(), 4);
        assert!(session_major > 0.0);
        let sent = [(0, 0), (1, 0), (0, 1), (1, 1)].into_iter();
        let bound = super::compute_sent(&plan, sent, Some(4));
        assert_eq!(bound.pooled.map(|p| p.hit_rate), Some(0.0));
    }

    #[test]
    fn bound_of_subset_in_order() {
        let recs = vec![rec(0.0, 8, &[1, 2]), rec(1.0, 8, &[1, 2])];
        let plan = plan_trace(recs, 4, 1);
        let only_second = super::compute(&plan, plan.sessions[1].turns.iter());
        assert_eq!(only_second.hit_tokens, 0);
        assert_eq!(whole(&plan).hit_tokens, 7);
    }
}
