//! Routing-text extraction (`request::parse`) on chat bodies of 1 KB, 100 KB and 1 MB, in
//! bytes per second (target: at least 1 GB/s on the two larger), and the whole routing
//! decision for a 400 KB body: parse, match and insert through the `cache_aware` selector
//! (target: at most 100 us).

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use prefix_router_core::BackendId;
use prefix_router_core::ledger::Account;
use prefix_router_core::policy::Balance;
use prefix_router_core::policy::{
    Candidate, PolicyParams, Request, Selector, SharedTunables, Tunables, choose,
};
use prefix_router_core::request::{Endpoint, blocks, parse};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::units::KeyBytes;
use serde_json::json;

/// A chat body of about `size` bytes: a system prompt, tools, and alternating turns with
/// tool calls and tool results, as an agent sends.
pub fn chat_body(size: usize) -> Vec<u8> {
    let line = "fn handle(request: &Request) -> Result<Response, Error> { let x = \"quoted\"; }\n";
    let turns = (size / 2000).clamp(1, 40);
    let per_turn = size / (turns * 3);
    let text = |n: usize| line.repeat(n / line.len() + 1);
    let mut messages = vec![json!({"role": "system", "content": text(per_turn)})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": text(per_turn / 2)}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{t}"), "type": "function",
             "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/{t}.rs\"}}")}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": format!("call_{t}"), "content": text(per_turn)}),
        );
    }
    let tools = json!([{"type": "function", "function": {"name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    serde_json::to_vec(&json!({"model": "m", "tools": tools, "messages": messages})).unwrap()
}

fn bench_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_chat");
    for (name, size) in [("1KB", 1 << 10), ("100KB", 100 << 10), ("1MB", 1 << 20)] {
        let body = chat_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| parse(Endpoint::Chat, std::hint::black_box(&body)).map(|p| p.text.len()))
        });
    }
    let (head, rest) = split_body();
    let body = format!("{head}1{rest}").into_bytes();
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("400KB_dense_escapes", |b| {
        b.iter(|| parse(Endpoint::Chat, std::hint::black_box(&body)).map(|p| p.text.len()))
    });
    let parsed = parse(Endpoint::Chat, &body).expect("a valid body");
    group.bench_function("400KB_dense_escapes_block_hashes", |b| {
        b.iter(|| blocks::chain(std::hint::black_box(&parsed.text)).len())
    });
    group.finish();
}

/// A `cache_aware` selector over two idle backends, with the default tree budget.
fn selector() -> (Selector, Vec<Candidate>) {
    let tunables = SharedTunables::fixed(Tunables {
        cache_threshold: 0.3,
        balance: Balance { abs: 64, rel: 1.5 },
    });
    let params = PolicyParams {
        tunables,
        tree: TreeConfig {
            budget: KeyBytes(16 << 20),
            ..TreeConfig::default()
        },
        seed: 0,
        clock: std::sync::Arc::new(prefix_router_core::clock::Monotonic::default()),
        calibrate: true,
        session_ttl: Duration::from_secs(60),
        conversations: None,
    };
    let selector = choose("cache_aware")
        .expect("cache_aware exists")
        .build(&params);
    let candidates = (0..2)
        .map(|i| Account::new(BackendId(i), u64::from(i)).candidate())
        .collect();
    (selector, candidates)
}

/// A 400 KB agent body as its first bytes, up to where a conversation id may go, and the
/// rest; `{head}{id}{rest}` is a whole chat body.
fn split_body() -> (String, String) {
    let code = r#"fn step(x: &str) -> String {\n    format!(\"{x}\")\n}\n"#.repeat(200);
    let message = |role: &str, text: &str| format!(r#"{{"role":"{role}","content":"{text}"}}"#);
    let head = format!(
        r#"{{"model":"m","messages":[{},{{"role":"user","content":""#,
        message("system", &code)
    );
    let turns: Vec<String> = (0..40)
        .map(|t| message(if t % 2 == 0 { "assistant" } else { "user" }, &code))
        .collect();
    (head, format!(r#""}},{}]}}"#, turns.join(",")))
}

fn bench_route(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_400KB");
    let (head, rest) = split_body();
    let (selector, candidates) = selector();
    let route = |body: &[u8]| {
        let parsed = parse(Endpoint::Chat, body).expect("a valid body");
        let request = Request::new(parsed.model, &parsed.text, None);
        selector.select(&request, &candidates).index
    };
    let mut n = 0u64;
    // Each iteration a new conversation: parse 400 KB, match, insert all of it. Evicting
    // (the router's background task) runs outside the timing.
    group.bench_function("new_conversation", |b| {
        b.iter_batched_ref(
            || {
                n += 1;
                selector.maintain(&|_| true);
                format!("{head}{n}{rest}").into_bytes()
            },
            |body| route(body),
            BatchSize::SmallInput,
        )
    });
    // Each iteration the next turn of a known conversation: match 400 KB, insert the turn.
    let known = format!("{head}known{rest}");
    route(known.as_bytes());
    let stem = &known[..known.len() - 2];
    group.bench_function("next_turn", |b| {
        b.iter_batched_ref(
            || {
                n += 1;
                selector.maintain(&|_| true);
                format!(r#"{stem},{{"role":"user","content":"and now step {n}"}}]}}"#).into_bytes()
            },
            |body| route(body),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_parse, bench_route);
criterion_main!(benches);
