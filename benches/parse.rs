//! Routing-text extraction (`request::parse`) on chat bodies of 1 KB, 100 KB and 1 MB, in
//! bytes per second. Target: at least 1 GB/s on the two larger.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prefix_router::request::{Endpoint, parse};
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
    group.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
