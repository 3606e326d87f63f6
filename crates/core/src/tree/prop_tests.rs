//! Property tests against a naive oracle: random texts over a tiny alphabet
//! (so prefixes collide), split into random parts, under random backends.

use proptest::collection::vec;
use proptest::prelude::*;

use super::text::{common_prefix, shard_of};
use super::*;

const MODELS: [&[u8]; 2] = [b"m0", b"m1"];
const BACKENDS: u32 = 4;

/// One insert: model index, backend, text, cut points splitting it into parts.
#[derive(Clone, Debug)]
struct Op {
    model: usize,
    backend: u32,
    text: Vec<u8>,
    cuts: Vec<usize>,
}

impl Op {
    /// The text split at the cut points (empty parts included).
    fn parts(&self) -> Vec<&[u8]> {
        let mut cuts: Vec<usize> = self.cuts.iter().map(|&c| c.min(self.text.len())).collect();
        cuts.sort_unstable();
        let mut parts = Vec::new();
        let mut start = 0;
        for c in cuts {
            parts.push(&self.text[start..c]);
            start = c;
        }
        parts.push(&self.text[start..]);
        parts
    }
}

fn op() -> impl Strategy<Value = Op> {
    (
        0..MODELS.len(),
        0..BACKENDS,
        vec(prop::sample::select(b"abc".to_vec()), 0..24),
        vec(0usize..25, 0..4),
    )
        .prop_map(|(model, backend, text, cuts)| Op {
            model,
            backend,
            text,
            cuts,
        })
}

fn config() -> impl Strategy<Value = TreeConfig> {
    (1usize..4, 0usize..5).prop_map(|(shards, shard_key_bytes)| TreeConfig {
        budget: crate::units::KeyBytes(usize::MAX),
        shards,
        shard_key_bytes,
        ..TreeConfig::default()
    })
}

/// Max common prefix of `query` with any text recorded under (`model`,
/// `backend`) that lands in the same shard.
fn oracle(config: &TreeConfig, done: &[Op], model: usize, backend: u32, query: &[u8]) -> usize {
    let shard = |t: &[u8]| shard_of(&[t], t.len(), config.shard_key_bytes, config.shards);
    done.iter()
        .filter(|o| o.model == model && o.backend == backend && shard(&o.text) == shard(query))
        .map(|o| common_prefix(&o.text, query))
        .max()
        .unwrap_or(0)
}

/// Compare every backend's match of every query with the oracle, exactly
/// (`exact`) or as an upper bound.
fn compare(t: &PrefixTrees, config: &TreeConfig, done: &[Op], queries: &[Op], exact: bool) {
    for q in done.iter().chain(queries) {
        let m = t.matches(MODELS[q.model], &q.parts());
        assert_eq!(m.total(), q.text.len());
        for backend in 0..BACKENDS {
            let got = m.matched(BackendId(backend));
            let want = oracle(config, done, q.model, backend, &q.text);
            if exact {
                assert_eq!(got, want, "backend {backend} query {q:?}");
            } else {
                assert!(got <= want, "backend {backend} query {q:?}: {got} > {want}");
            }
        }
    }
}

fn insert_all(t: &PrefixTrees, ops: &[Op]) {
    for o in ops {
        t.insert(MODELS[o.model], &o.parts(), BackendId(o.backend));
        if let Err(e) = t.check_invariants() {
            panic!("after {o:?}: {e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_equal_the_oracle_without_eviction(
        config in config(), ops in vec(op(), 0..40), queries in vec(op(), 0..10)
    ) {
        let t = PrefixTrees::new(config.clone());
        insert_all(&t, &ops);
        compare(&t, &config, &ops, &queries, true);
    }

    #[test]
    fn eviction_respects_budgets_and_never_invents_matches(
        config in config(), budget in 0usize..40,
        ops in vec(op(), 0..40), queries in vec(op(), 0..10)
    ) {
        let config = TreeConfig { budget: crate::units::KeyBytes(budget), ..config };
        let t = PrefixTrees::new(config.clone());
        for chunk in ops.chunks(7) {
            insert_all(&t, chunk);
            t.evict();
            prop_assert!(t.check_invariants().is_ok(), "{:?}", t.check_invariants());
            prop_assert!(t.stats().backends.iter().all(|&(_, used)| used <= budget));
            prop_assert!(!t.over_budget());
        }
        compare(&t, &config, &ops, &queries, false);
    }

    #[test]
    fn retain_backends_forgets_exactly_the_dropped_ones(
        config in config(), ops in vec(op(), 0..40), queries in vec(op(), 0..10)
    ) {
        let t = PrefixTrees::new(config.clone());
        insert_all(&t, &ops);
        t.retain_backends(|b| b.0 % 2 == 0);
        prop_assert!(t.check_invariants().is_ok(), "{:?}", t.check_invariants());
        let kept: Vec<Op> = ops.iter().filter(|o| o.backend % 2 == 0).cloned().collect();
        for q in ops.iter().chain(&queries) {
            let m = t.matches(MODELS[q.model], &q.parts());
            for backend in 0..BACKENDS {
                let want = oracle(&config, &kept, q.model, backend, &q.text);
                prop_assert_eq!(m.matched(BackendId(backend)), want);
            }
        }
    }
}
