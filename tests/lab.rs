//! The lab against the real-time path, and the index sized from what backends publish.

use std::time::Duration;

use prefix_router_demo::{DemoArgs, compare as real_time};
use prefix_router_lab::scenario::Scenario;
use prefix_router_lab::{Setting, compare as lab};
use serde_json::Value;

use crate::support::*;

/// The same small agent workload in real time (the demo's path: simulated backends, the
/// router, the replay, on loopback) and in the lab: hit rates must agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_agrees_with_the_real_time_path_on_a_small_workload() {
    // Real-time placement depends on timing: not next to the soak or the held bodies.
    let _heavy = heavy().await;
    // Not consistent_hash: its placement follows the backends' random ports in real time.
    let policies = vec!["cache_aware".to_string(), "kv_aware".to_string()];
    let dir = scratch_dir("lab");
    let demo = DemoArgs {
        policies: policies.clone(),
        backends: 2,
        trace: None,
        speedup: 20.0,
        sessions: 8,
        session_rate: 0.5,
        max_requests: Some(120),
        send_session_header: false,
        kv_blocks: 4_000,
        max_tree_size: None,
        concurrency: 64,
        out_dir: dir,
        replicas: 1,
        no_shared_table: false,
        tokenizer: None,
        kv_events: false,
        scenario: Default::default(),
        max_num_seqs: 4,
        scenario_seconds: 30.0,
    };
    let setting = Setting {
        max_requests: Some(120),
        ..Setting::of(Scenario::small(8, 4))
    };
    let names = policies.clone();
    let virtual_time = tokio::task::spawn_blocking(move || lab(&setting, &names, &mut |_| {}))
        .await
        .unwrap()
        .unwrap();
    for v in &virtual_time {
        assert_eq!(
            v.report.requests.ok, 120,
            "{}: answered in the lab",
            v.policy
        );
    }
    // How far one real-time run strays from the lab on this workload, lower the busier the
    // machine (2026-12-06, 4 runs): kv_aware 0.740-0.749 (lab 0.742); cache_aware, whose
    // imbalance bound trips at moments that depend on timing, 0.676-0.704 (lab 0.709).
    // With 4 sessions instead of 8, one placement decided the run: kv_aware came out at
    // 0.694 or 0.826 in real time against 0.833 in the lab. A run is a sample of that
    // timing: a second run is taken when the first strays out of the band, and the test
    // fails when both do.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let real = real_time(&demo, |_| {}).await.unwrap();
        let mut agree = true;
        for (r, v) in real.iter().zip(&virtual_time) {
            assert_eq!(
                r.report.requests.ok, 120,
                "{}: answered in real time",
                r.policy
            );
            let (real_hit, lab_hit) = (
                r.report.hit_rate.unwrap_or(0.0),
                v.report.hit_rate.unwrap_or(0.0),
            );
            let (below, above) = if r.policy == "cache_aware" {
                (0.15, 0.05)
            } else {
                (0.08, 0.05)
            };
            agree &= (lab_hit - below..=lab_hit + above).contains(&real_hit);
            seen.push(format!(
                "{}: real time {real_hit:.3}, lab {lab_hit:.3}",
                r.policy
            ));
        }
        if agree {
            return;
        }
    }
    panic!("real time strayed from the lab twice: {seen:?}");
}

async fn workers(router: &TestRouter) -> Vec<Value> {
    let body = router.admin_json("/workers").await;
    body["workers"].as_array().unwrap().clone()
}

/// A backend that publishes `vllm:cache_config_info` gets an index sized from it; one that
/// does not keeps the configured `max_tree_size`; what is remembered stays within them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_sizes_itself_from_a_backends_cache_config_info() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = prefix_router_sim::SimConfig {
        kv_blocks: 1_000,
        time_scale: 100.0,
        ..prefix_router_sim::SimConfig::default()
    };
    let sim = prefix_router_sim::start(config, listener).await.unwrap();
    let plain = TestUpstream::start("plain").await;
    let mut s = settings(&[&plain]);
    s.worker_urls = Some(vec![format!("http://{}", sim.addr), plain.url()]);
    s.max_tree_size = Some(100_000);
    let router = TestRouter::start(s, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let sized = loop {
        let rows = workers(&router).await;
        if rows
            .iter()
            .any(|w| w["kv_tokens"] == 16_000 && w["index_budget_tokens"] == 16_000)
        {
            break rows;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never sized: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let other = sized.iter().find(|w| w["url"] == plain.url()).unwrap();
    assert_eq!(
        (
            other["kv_tokens"].clone(),
            other["index_budget_tokens"].clone()
        ),
        (Value::Null, 100_000.into())
    );
    // The simulator publishes its load under vLLM's names; the plain upstream does not.
    let sim_row = sized.iter().find(|w| w["url"] != plain.url()).unwrap();
    let published = &sim_row["published"];
    assert_eq!(
        (published["running"].clone(), published["waiting"].clone()),
        (0.into(), 0.into())
    );
    assert_eq!(published["kv_usage"], 0.0);
    assert_eq!(other["published"], Value::Null);
    // The sim's blocks as it publishes them; before any report, 4 bytes of text a token.
    assert_eq!(sim_row["kv_block_tokens"], 16);
    assert_eq!(other["kv_block_tokens"], Value::Null);
    assert_eq!(sim_row["text_bytes_per_token"], 4.0);
    // Far more text than the sim's index may hold: it stays within its budget.
    let sim_url = format!("http://{}", sim.addr);
    for i in 0..40 {
        let text = format!("conversation {i} {}", "w".repeat(6_000));
        let body = serde_json::json!({"model": prefix_router_sim::DEFAULT_MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": text}]});
        let (status, _) = post(&router.url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200);
    }
    router
        .wait_until("the sim's index is within its budget", |r| {
            let tree = r.state().selector.index().unwrap().stats();
            let sim_id = r
                .state()
                .fleet
                .snapshot()
                .backends
                .iter()
                .find(|b| b.worker.url == sim_url)
                .unwrap()
                .id;
            tree.backends
                .iter()
                .all(|&(b, bytes)| b != sim_id || bytes <= 8_000 * 11 / 10)
        })
        .await;
}
