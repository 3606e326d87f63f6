//! Flow control against what the engines publish: the hold learnt from an engine's queue
//! (what it queues past it waits in the router's queue), and the KV a heavy tenant leaves
//! for a light tenant's requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_router::config::Settings;
use tokio::sync::Notify;

use crate::support::*;
use crate::tenants::*;

/// A vLLM page of `running` requests and `waiting` ones queued.
fn load_page(running: u32, waiting: u32) -> String {
    format!(
        "vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n\
         vllm:kv_cache_usage_perc 0.1\n"
    )
}

/// A router in front of `up` reading its load every 0.1 s, with the tenants file `text`
/// (named `name`) and a queue timeout of 10 s.
fn reading_load(up: &TestUpstream, name: &str, text: &str) -> TestRouter {
    let settings = Settings {
        metrics_interval: Some(0.1),
        queue_timeout: Some(10.0),
        tenants_file: Some(tenants_file(name, text)),
        ..settings(&[up])
    };
    TestRouter::start(settings, 1)
}

/// Three requests placed on one backend before the router knew how many its engine runs,
/// the engine then saying it runs one and queues two, under a tenants file with
/// `standing` slots: what the backend received, in order, and when; and how many were
/// stopped.
async fn three_on_an_engine_of_one(standing: usize) -> (Vec<String>, Vec<Instant>, f64) {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Slow(ANSWER));
    up.set_pages(&load_page(0, 0), "");
    let file = format!(
        "standing_slots = {standing}\n[tenants.p]\nkeys = [\"{}\"]\n",
        sha256_entry("sk-priority")
    );
    let router = reading_load(&up, &format!("take-back-{standing}"), &file);
    let mut sent = Vec::new();
    for (n, name) in ["one", "two", "three"].into_iter().enumerate() {
        sent.push(tokio::spawn(post_named(router.url.clone(), name, "normal")));
        router.wait_until(name, |_| up.count() == n + 1).await;
    }
    up.set_pages(&load_page(1, 2), "");
    for request in sent {
        assert_eq!(request.await.unwrap(), 200, "nothing lost");
    }
    let at = up.received().iter().map(|r| r.at).collect();
    let metrics = router.metrics().await;
    let stopped = sum(&metrics, "prefix_router_tenant_preempted_total", &[]);
    (arrivals(&up), at, stopped)
}

/// How long the backend of [`three_on_an_engine_of_one`] takes to answer.
const ANSWER: Duration = Duration::from_millis(1000);

/// With standing slots, requests an engine queues past the hold the router learns from
/// it are taken back: they wait in the router's queue, where priorities and shares act,
/// and are placed again as the engine finishes what it runs. Without, they stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_standing_slots_what_an_engine_queues_past_its_hold_waits_in_the_router() {
    let (mut arrived, at, stopped) = three_on_an_engine_of_one(1).await;
    assert_eq!(arrived.len(), 5);
    arrived[3..].sort();
    assert_eq!(
        arrived,
        vec!["one", "two", "three", "three", "two"],
        "the last two placed were taken back and placed again"
    );
    assert!(
        at[3] >= at[0] + ANSWER && at[4] >= at[3] + ANSWER,
        "placed again one at a time, as the engine had room: {at:?}"
    );
    assert_eq!(stopped, 2.0);
    let (arrived, _, stopped) = three_on_an_engine_of_one(0).await;
    assert_eq!(
        (arrived, stopped),
        (vec!["one".into(), "two".into(), "three".into()], 0.0),
        "without standing slots"
    );
}

/// A heavy tenant's requests, light `b` in flight beside them, on a backend publishing
/// 1,024 tokens of KV and a hold of 8: how many reached the backend before any ended, and
/// whether all were answered. With `kv`, the backend publishes its KV capacity.
async fn heavy_beside_light(kv: bool) -> (usize, bool) {
    let up = TestUpstream::start("a").await;
    let gate = Arc::new(Notify::new());
    up.set_reply(UpstreamReply::Sse {
        chunks: 2,
        gate: Arc::clone(&gate),
    });
    let capacity = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\"} 1.0\n";
    let page = format!("{}{}", if kv { capacity } else { "" }, load_page(8, 1));
    up.set_pages(&page, "");
    let file = format!(
        "[tenants.a]\nkeys = [\"{}\"]\n[tenants.b]\nkeys = [\"{}\"]\n",
        sha256_entry("sk-heavy"),
        sha256_entry("sk-light")
    );
    let router = reading_load(&up, &format!("kv-{kv}"), &file);
    let account = |r: &TestRouter| Arc::clone(r.state().fleet.ready(&[]).accounts()[0]);
    let held = |r: &TestRouter| {
        let account = account(r);
        account.hold().is_some() && account.capacity().is_some() == kv
    };
    router.wait_until("the hold is learned", held).await;
    // Tokens at 4 bytes each: a's two short requests, b's 500, then a's 200 each.
    let sent = [("sk-heavy", 8), ("sk-heavy", 8), ("sk-light", 2_000)]
        .into_iter()
        .chain([("sk-heavy", 800); 3]);
    let mut asked = Vec::new();
    for (n, (key, bytes)) in sent.enumerate() {
        let text = "x".repeat(bytes);
        asked.push(tokio::spawn(ask_as(router.url.clone(), key, text)));
        // Answered (its prefill no longer holds others back), or queued.
        let placed = |r: &TestRouter| {
            let answered = up.count() == n + 1 && account(r).pending().0 == 0;
            answered || r.state().queue.len() == 1
        };
        router.wait_until("answered or queued", placed).await;
    }
    let before = up.count();
    let body = chat(&[("user", "x".repeat(800))]);
    let explained = explain_as(&router, "sk-heavy", "normal", &body).await;
    let backend = &explained["backends"][0];
    assert_eq!(backend["open"], !kv, "POST /route agrees: {explained}");
    let room = backend["room"].as_u64();
    assert!(
        room.is_some() && room < backend["hold"].as_u64(),
        "the room it may take, under the hold less the reserve: {explained}"
    );
    assert!(
        backend["kept_tokens"].as_u64() >= Some(500)
            && backend["inflight_tokens"].as_u64() >= Some(900),
        "and shows the KV in flight and left for b: {explained}"
    );
    for _ in 0..200 {
        if asked.iter().all(|a| a.is_finished()) {
            break;
        }
        gate.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut answered = true;
    for a in asked {
        answered &= a.await.unwrap().0 == 200;
    }
    (before, answered)
}

/// Where the engines are bound by KV, a tenant over its share leaves the KV that a light
/// tenant's requests had in flight: the heavy request that would fill the backend's KV
/// past it waits in the router's queue until one ends. Without a published capacity,
/// slots alone decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_tenant_leaves_the_kv_a_light_ones_requests_had_in_flight() {
    assert_eq!(
        heavy_beside_light(true).await,
        (5, true),
        "5 + 200 + 200 + 500 fit in 1,024 tokens; a third 200 waits, and is answered"
    );
    assert_eq!(heavy_beside_light(false).await, (6, true), "slots only");
}
