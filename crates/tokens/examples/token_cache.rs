//! The token cache's memory for many long conversations: N conversations of about 400 KB,
//! every message its own (nothing shared between conversations), rendered and tokenized
//! with the tokenizer in DIR into one cache of BUDGET bytes (default: no limit); prints the
//! bytes the cache accounts for and the growth of the process's resident memory.
//!
//! Usage: cargo run --release -p prefix-router-tokens --example token_cache -- DIR [N [BUDGET]]

use std::time::Instant;

use prefix_router_core::request::Endpoint;
use prefix_router_tokens::{Model, TokenCache};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kib.unwrap_or(0.0) / 1024.0
}

fn body(n: usize) -> Vec<u8> {
    let code = "fn step(x: &str) -> String {\n    format!(\"{x} and more\")\n}\n".repeat(70);
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    messages.push(json!({"role": "user", "content": format!("conversation {n}: {code}")}));
    for t in 0..95 {
        messages.push(json!({"role": "assistant", "content": format!("done {t} of {n}: edited")}));
        messages.push(json!({"role": "user", "content": format!("turn {t} of {n}: {code}")}));
    }
    serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: token_cache DIR [N]")?;
    let n: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let budget: usize = args.next().map_or(Ok(usize::MAX), |a| a.parse())?;
    let model = Model::load(dir.as_ref())?;
    let cache = TokenCache::new(budget);
    let (before, started) = (rss_mib(), Instant::now());
    let (mut tokens, mut bytes) = (0, 0);
    for i in 0..n {
        let body = body(i);
        bytes += body.len();
        let prompt = model.renderer().prompt(Endpoint::Chat, &body)?;
        tokens += model.encode(&prompt, &cache)?.tokens;
    }
    let grown = rss_mib() - before;
    println!(
        "{n} conversations, {:.0} KB of body and {} tokens each, cache budget {budget}: \
         cache {:.1} MiB accounted ({:.2} bytes/token), resident memory +{grown:.1} MiB, {:.0} s",
        bytes as f64 / n as f64 / 1024.0,
        tokens / n,
        cache.bytes() as f64 / (1 << 20) as f64,
        cache.bytes() as f64 / tokens as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
