//! A bounded soak: the router binary in front of simulated backends, driven as hard as the
//! machine allows by many concurrent connections with mixed small and 400 KB bodies. No
//! request may fail, the router's resident memory must stay flat after warm-up (within 10%
//! of what it was at 10 s), and nothing may stay in flight.
//!
//! CI runs it for 15 s with 200 connections; the full run is
//! `SOAK_SECS=60 SOAK_CONNS=1000 cargo test --release --test tests soak -- --nocapture`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use prefix_router_sim::{SimConfig, SimHandle};
use serde_json::json;

use crate::support::*;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn start_sims(count: usize) -> Vec<SimHandle> {
    let mut sims = Vec::new();
    for i in 0..count {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = SimConfig {
            time_scale: 200.0,
            max_num_seqs: 1024,
            name: format!("soak-{i}"),
            model: "m".into(),
            ..SimConfig::default()
        };
        sims.push(prefix_router_sim::start(config, listener).await.unwrap());
    }
    sims
}

/// Request `i` of connection `conn`: 1 in 10 carries a 400 KB conversation.
fn body(conn: u64, i: u64, big: &[String]) -> serde_json::Value {
    let user = format!("connection {conn} request {i}");
    match i % 10 {
        0 => json!({"model": "m", "max_tokens": 4, "messages": [
            {"role": "system", "content": big[(conn % big.len() as u64) as usize]},
            {"role": "user", "content": user}]}),
        _ => json!({"model": "m", "max_tokens": 4, "messages": [
            {"role": "system", "content": "You are a helpful assistant. ".repeat(30)},
            {"role": "user", "content": user}]}),
    }
}

/// The router's budget for buffered bodies in the soak, bytes.
const SOAK_BUDGET: u64 = 256 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_keeps_memory_flat_and_loses_nothing() {
    let _heavy = heavy().await;
    let (secs, conns) = (env_or("SOAK_SECS", 15).max(12), env_or("SOAK_CONNS", 200));
    let sims = start_sims(4).await;
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let (mut command, url, admin_url) = router_binary();
    let mut router = command
        .args([
            "--worker-urls",
            &urls.join(","),
            "--max-tree-size",
            "420000",
            "--max-buffered-bytes",
            &SOAK_BUDGET.to_string(),
        ])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let big: Vec<String> = (0..4)
        .map(|k| format!("shared document {k}: ").repeat(400_000 / 20))
        .collect();
    let big = Arc::new(big);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(conns as usize)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    while client
        .get(format!("{admin_url}/health"))
        .send()
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let mut workers = Vec::new();
    for conn in 0..conns {
        let (client, url, big, ok, failed) = (
            client.clone(),
            url.clone(),
            Arc::clone(&big),
            Arc::clone(&ok),
            Arc::clone(&failed),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < deadline {
                let sent = client
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&body(conn, i, &big))
                    .send()
                    .await;
                let good = match sent {
                    Ok(resp) => resp.status() == 200 && resp.bytes().await.is_ok(),
                    Err(_) => false,
                };
                let counter = if good { &ok } else { &failed };
                counter.fetch_add(1, SeqCst);
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_at_10 = rss_kib(router.id());
    for worker in workers {
        worker.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rss_end = rss_kib(router.id());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = reqwest::get(format!("{admin_url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape =
        prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_string()))).unwrap();
    let inflight = sum(&scrape, "prefix_router_inflight_requests", &[]);
    let tree = sum(&scrape, "prefix_router_tree_bytes", &[]);
    let _ = router.kill();
    let _ = router.wait();
    let (ok, failed) = (ok.load(SeqCst), failed.load(SeqCst));
    eprintln!(
        "soak: {secs} s, {conns} connections: {ok} ok ({:.0} req/s), {failed} failed; router RSS {} MiB at 10 s, {} MiB at the end; tree {} KiB",
        ok as f64 / elapsed,
        rss_at_10 / 1024,
        rss_end / 1024,
        tree as u64 / 1024
    );
    assert_eq!(failed, 0, "requests failed");
    assert!(ok > conns, "too few requests completed");
    assert_eq!(inflight, 0.0, "requests left in flight");
    assert!(
        rss_end <= (SOAK_BUDGET >> 10) + (100 << 10),
        "RSS {rss_end} KiB is over the body budget plus 100 MiB"
    );
    assert!(
        rss_end as f64 <= rss_at_10 as f64 * 1.10,
        "RSS grew from {rss_at_10} to {rss_end} KiB"
    );
}
