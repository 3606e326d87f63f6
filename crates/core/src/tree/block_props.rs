//! The block-hash index against the text tree it replaces: on random conversations of
//! every request kind, parsed as the router parses them, a backend's match on the chain of
//! block hashes is its match on the text rounded down to a whole block; and eviction keeps
//! every budget, counted in blocks.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::request::blocks;
use crate::request::{Endpoint, parse};
use crate::units::{BLOCK_BYTES, KEY_BYTES, KeyBytes, TextBytes};

/// Pieces of text longer and shorter than a block, so that texts share prefixes that end
/// anywhere inside a block.
const PIECES: [&str; 6] = [
    "You are a careful assistant who answers in full sentences. ",
    "Read src/main.rs and explain what it does. ",
    "fn main() {\n    println!(\"hello\");\n}\n",
    "ok",
    "The function prints a greeting and exits. It takes no arguments at all. ",
    "{\"path\": \"src/lib.rs\"}",
];

/// A conversation: its turns, each a list of piece indexes.
fn turns() -> impl Strategy<Value = Vec<Vec<usize>>> {
    vec(vec(0..PIECES.len(), 1..4), 1..7)
}

/// The body of the conversation's first `n` turns as `endpoint` takes it.
fn body(endpoint: Endpoint, turns: &[Vec<usize>], n: usize) -> Vec<u8> {
    let text = |t: &Vec<usize>| t.iter().map(|&i| PIECES[i]).collect::<String>();
    let role = |i: usize| match i {
        0 => "system",
        i if i % 2 == 1 => "user",
        _ => "assistant",
    };
    let messages: Vec<Value> = (turns[..n].iter().enumerate())
        .map(|(i, t)| json!({"role": role(i), "content": text(t)}))
        .collect();
    let value = match endpoint {
        Endpoint::Chat => json!({"model": "m", "messages": messages}),
        Endpoint::Completions => {
            let prompt: String = turns[..n].iter().map(text).collect();
            json!({"model": "m", "prompt": prompt})
        }
        Endpoint::Responses => {
            json!({"model": "m", "instructions": text(&turns[0]), "input": messages[1.min(n - 1)..].to_vec()})
        }
        Endpoint::Messages | Endpoint::CountTokens => {
            json!({"model": "m", "system": text(&turns[0]), "messages": messages[1.min(n - 1)..].to_vec()})
        }
    };
    serde_json::to_vec(&value).unwrap()
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop_oneof![
        Just(Endpoint::Chat),
        Just(Endpoint::Completions),
        Just(Endpoint::Responses),
        Just(Endpoint::Messages)
    ]
}

/// One shard, so that both trees compare texts with texts.
fn one_shard(bytes: usize) -> TreeConfig {
    TreeConfig {
        budget: KeyBytes(bytes),
        shards: 1,
        ..TreeConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_block_match_is_the_text_match_rounded_down_to_a_block(
        conversations in vec((endpoint(), turns(), 0u32..3), 1..8),
    ) {
        let text_tree = PrefixTrees::new(one_shard(usize::MAX));
        let block_tree = PrefixTrees::new(one_shard(usize::MAX));
        let bodies: Vec<(Vec<u8>, u32)> = conversations
            .iter()
            .flat_map(|(e, t, b)| (1..=t.len()).map(move |n| (body(*e, t, n), *b)))
            .collect();
        let endpoints: Vec<Endpoint> = conversations
            .iter()
            .flat_map(|(e, t, _)| std::iter::repeat_n(*e, t.len()))
            .collect();
        for ((body, backend), endpoint) in bodies.iter().zip(&endpoints) {
            let parsed = parse(*endpoint, body).unwrap();
            let chain = blocks::chain(&parsed.text);
            let (text_parts, keys) = (parsed.text.parts(), [chain.as_flattened()]);
            let total = parsed.text.len();
            for b in 0..3 {
                let b = BackendId(b);
                let by_text = text_tree.matches(b"m", text_parts).matched(b);
                let by_block = block_tree.matches(b"m", &keys).text(TextBytes(total)).matched(b).0;
                prop_assert_eq!(by_block, by_text / BLOCK_BYTES * BLOCK_BYTES, "backend {:?}", b);
            }
            text_tree.insert(b"m", text_parts, BackendId(*backend));
            block_tree.insert(b"m", &keys, BackendId(*backend));
        }
    }

    #[test]
    fn eviction_keeps_every_budget_in_blocks(
        conversations in vec((endpoint(), turns(), 0u32..3), 1..8),
        budget_blocks in 1usize..40,
    ) {
        let budget = budget_blocks * KEY_BYTES;
        let tree = PrefixTrees::new(one_shard(budget));
        for (endpoint, turns, backend) in &conversations {
            for n in 1..=turns.len() {
                let body = body(*endpoint, turns, n);
                let parsed = parse(*endpoint, &body).unwrap();
                let chain = blocks::chain(&parsed.text);
                tree.insert(b"m", &[chain.as_flattened()], BackendId(*backend));
            }
            tree.evict();
            prop_assert!(tree.stats().backends.iter().all(|&(_, used)| used <= budget));
            prop_assert!(tree.check_invariants().is_ok());
        }
    }
}
