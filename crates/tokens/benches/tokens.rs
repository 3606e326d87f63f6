//! Rendering and tokenizing with the Qwen3 tokenizer (fetched into target/tokenizers by
//! `tests/tokens/fetch.sh target/tokenizers`): a 1 KB request, a new 400 KB conversation,
//! and the next turn of a 400 KB conversation (about 4 KB new). Writes the 400 KB render
//! to target/tokens-bench-400k.txt for `benches/tokens/python.py` to tokenize the same text.

use std::hint::black_box;

/// As the router: jemalloc (the tokenizers crate allocates heavily).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use prefix_router_core::request::Endpoint;
use prefix_router_tokens::{Model, Prompt, TokenCache};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target"))
}

/// A coding-agent conversation of `turns` turns of about 4 KB each.
fn conversation(turns: usize) -> Vec<Value> {
    let code = "fn step(x: &str) -> String {\n    format!(\"{x} and more\")\n}\n".repeat(70);
    let mut messages =
        vec![json!({"role": "system", "content": "You are a coding agent. ".repeat(40)})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("turn {t}: fix this\n{code}")}));
        messages.push(
            json!({"role": "assistant", "content": format!("done {t}: {}", "edited ".repeat(300))}),
        );
    }
    messages
}

fn body(messages: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap()
}

fn benches(c: &mut Criterion) {
    let model = Model::load(&root().join("tokenizers/qwen3"))
        .expect("run tests/tokens/fetch.sh target/tokenizers");
    let small = body(
        &conversation(0)[..1]
            .iter()
            .cloned()
            .chain([json!({"role": "user", "content": "hello ".repeat(150)})])
            .collect::<Vec<_>>(),
    );
    let mut long = conversation(50);
    while body(&long).len() < 400_000 {
        long.extend(conversation(1).into_iter().skip(1));
    }
    let long_body = body(&long);
    let mut next = long.clone();
    next.push(
        json!({"role": "user", "content": format!("and now: {}", "check the tests ".repeat(250))}),
    );
    let next_body = body(&next);
    let prompt = |b: &[u8]| model.renderer().prompt(Endpoint::Chat, b).unwrap();
    if let Prompt::Text { text, .. } = prompt(&long_body) {
        std::fs::write(root().join("tokens-bench-400k.txt"), text).unwrap();
    }
    let mut group = c.benchmark_group("qwen3");
    group.sample_size(20);
    // Nothing seen before: an empty cache every time.
    let fresh = |body: &'static [u8]| move || (body, TokenCache::new(1 << 30));
    let encode = |(body, cache): (&[u8], TokenCache)| {
        model
            .encode(&prompt(black_box(body)), &cache)
            .unwrap()
            .tokens
    };
    let small: &'static [u8] = small.leak();
    let long: &'static [u8] = long_body.clone().leak();
    group.bench_function("1KB_request", |b| {
        b.iter_batched(fresh(small), encode, BatchSize::SmallInput)
    });
    group.bench_function("new_400KB_conversation", |b| {
        b.iter_batched(fresh(long), encode, BatchSize::PerIteration)
    });
    group.bench_function("render_only_400KB", |b| {
        b.iter(|| prompt(black_box(&next_body)))
    });
    group.bench_function("next_turn_400KB_plus_4KB", |b| {
        b.iter_batched(
            || {
                let cache = TokenCache::new(1 << 30);
                model.encode(&prompt(&long_body), &cache).unwrap();
                cache
            },
            |cache| {
                model
                    .encode(&prompt(black_box(&next_body)), &cache)
                    .unwrap()
                    .reused
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(tokens, benches);
criterion_main!(tokens);
