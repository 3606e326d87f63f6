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

use super::plan::{Plan, Turn};

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
}

/// Computes the bound over `turns`, taken in the order given.
pub(crate) fn compute<'a>(plan: &Plan, turns: impl Iterator<Item = &'a Turn>) -> Bound {
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

/// The bound over the turns that were sent, `(session, turn)` pairs in any
/// order, taken in schedule order.
pub(crate) fn compute_sent(plan: &Plan, sent: impl Iterator<Item = (u32, u32)>) -> Bound {
    let mut sent: Vec<(u32, u32)> = sent.collect();
    sent.sort_unstable();
    sent.dedup();
    let turns = sent
        .into_iter()
        .map(|(s, t)| &plan.sessions[s as usize].turns[t as usize]);
    compute(plan, turns)
}

/// Number of leading blocks already seen, and the tokens they cover.
fn leading_hits(plan: &Plan, turn: &Turn, seen: &[bool]) -> (u64, u64) {
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

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::super::trace::{TraceRecord, plan_trace};

    fn rec(ts: f64, input: u64, ids: &[u64]) -> TraceRecord {
        TraceRecord {
            timestamp_ms: ts,
            input_length: input,
            output_length: 1,
            hash_ids: ids.to_vec(),
            session_id: None,
        }
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
        let b = plan.bound.clone();
        assert_eq!(b.requests, 5);
        assert_eq!(b.prompt_tokens, 44);
        assert_eq!(b.hit_tokens, 8 + 11 + 3);
        assert!((b.hit_rate - 22.0 / 44.0).abs() < 1e-12);
        // blocks: 3+3+3+2+1 = 12, seen 0+2+3+0+1 = 6
        assert!((b.blocks_seen_rate - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bound_of_subset_in_order() {
        let recs = vec![rec(0.0, 8, &[1, 2]), rec(1.0, 8, &[1, 2])];
        let plan = plan_trace(recs, 4, 1);
        let only_second = super::compute(&plan, plan.sessions[1].turns.iter());
        assert_eq!(only_second.hit_tokens, 0);
        assert_eq!(plan.bound.hit_tokens, 7);
    }
}
