//! The simulator's KV events as the router reads them: behind a router in token mode its
//! events make the router's predictions exact, and its replay socket answers as vLLM's.

use prefix_router_core::events::decode::{self, Event, Medium};
use serde_json::Value;

use crate::kv_events::port;

/// Two simulated engines publishing their KV events (`--kv-events-config`, token ids from
/// Qwen3's tokenizer) behind a router in token mode: the record of the engine that served a
/// conversation holds its prompt, the next turn goes there, and the router's prediction of
/// that turn's hit is what the engine delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_events_make_the_router_exact() {
    use crate::support::*;
    use serde_json::json;
    let config = prefix_router_sim::SimConfig {
        time_scale: 50.0,
        ..prefix_router_sim::SimConfig::default()
    };
    let (sims, urls, router) = publishing(&["a", "b"], config).await;
    let explain = |body: Value| {
        let router = &router;
        async move { explain(router, &body).await }
    };
    let mut messages = vec![
        json!({"role": "system", "content": "You review Rust code for a proxy. ".repeat(30)}),
        json!({"role": "user", "content": "What does this function do? ".repeat(40)}),
    ];
    let body = |messages: &[Value]| json!({"model": "m", "max_tokens": 8, "messages": messages});
    records_exact(&router, &urls, &body(&messages)).await;
    let (status, first) = post(&router.url, "/v1/chat/completions", &body(&messages)).await;
    assert_eq!(status, 200, "{first}");
    let served = first["system_fingerprint"].as_str().unwrap().to_string();
    let home = &urls[usize::from(served == "b")];
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let held = prompt / 16 * 16;
    let mut why = explain(body(&messages)).await;
    for _ in 0..200 {
        if record(&why, home)["gpu_tokens"] == held {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        why = explain(body(&messages)).await;
    }
    assert_eq!(record(&why, home)["gpu_tokens"], held, "{why}");
    let other = urls.iter().find(|u| *u != home).unwrap();
    assert_eq!(record(&why, other)["gpu_tokens"], 0, "{why}");

    // The next turn: routed home, predicted from the record, delivered by the engine.
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And its error paths? ".repeat(10)}));
    let why = explain(body(&messages)).await;
    assert_eq!(why["backend"], *home, "{why}");
    let (status, second) = post(&router.url, "/v1/chat/completions", &body(&messages)).await;
    assert_eq!(
        (status, second["system_fingerprint"].as_str()),
        (200, Some(served.as_str()))
    );
    let cached = &second["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(why["matched_tokens"], *cached, "{why} {second}");
    // The router notes an answer's usage after relaying it.
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
    let stats = router.admin_json("/stats").await;
    let (predicted, delivered) = (&stats["predicted_hit_rate"], &stats["delivered_hit_rate"]);
    let gap = (predicted.as_f64().unwrap() - delivered.as_f64().unwrap()).abs();
    assert!(gap < 0.01, "{stats}");
    for sim in sims {
        sim.shutdown().await;
    }
}

/// A prompt sent to an engine counts as held there until the engine answers, though the
/// engine publishes its blocks only once it schedules them: a second conversation on the
/// same system prompt, asked while the first waits in the engine's queue, is predicted to
/// find it there (vLLM mode knows what token mode's own index knows). A request that ends
/// unanswered counts no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_waiting_in_the_engine_counts_as_held_until_answered() {
    use crate::support::*;
    use serde_json::json;
    // One sequence at a time: a long answer holds the engine while the next prompt waits.
    let config = prefix_router_sim::SimConfig {
        max_num_seqs: 1,
        ..prefix_router_sim::SimConfig::default()
    };
    let (sims, urls, router) = publishing(&["a"], config).await;
    let ask = |user: &str, max_tokens: u32| {
        json!({"model": "m", "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": "You review Rust code for a proxy. ".repeat(30)},
            {"role": "user", "content": user}]})
    };
    records_exact(&router, &urls, &ask("warm up", 1)).await;
    let long = json!({"model": "m", "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Write a long story. ".repeat(20)}]});
    let url = router.url.clone();
    let holding = tokio::spawn(async move { post(&url, "/v1/chat/completions", &long).await });
    router
        .wait_until("the long answer runs", |r| r.inflight() == 1)
        .await;
    let url = router.url.clone();
    let first = ask("What does this function do?", 4);
    let waiting = tokio::spawn(async move { post(&url, "/v1/chat/completions", &first).await });
    router
        .wait_until("the first turn waits", |r| r.inflight() == 2)
        .await;
    let second = ask("And its error paths?", 4);
    let why = explain(&router, &second).await;
    assert_eq!(
        record(&why, &urls[0])["gpu_tokens"],
        0,
        "nothing published yet: {why}"
    );
    let matched = why["matched_tokens"].as_u64().unwrap_or_default();
    assert!(matched >= 160, "the waiting prompt's system prompt: {why}");
    // Once it ends unanswered, only the record counts; the long answer still holds the engine.
    waiting.abort();
    router
        .wait_until("the first turn ended", |r| r.inflight() == 1)
        .await;
    let why = explain(&router, &second).await;
    assert_eq!(why["matched_tokens"], 0, "{why}");
    holding.abort();
    for sim in sims {
        sim.shutdown().await;
    }
}

/// The simulator's replay socket answers as vLLM's does: every buffered batch from the
/// asked sequence number on (`["", topic, seq, payload]`), then `["", "", -1, ""]`; the
/// batches hold the blocks its cache stored, with their token ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_replays_its_batches_like_vllm() {
    use bytes::Bytes;
    use prefix_router_sim::kv_events::KvEventsConfig;
    use serde_json::json;
    use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};
    let (publish, replay) = (port(), port());
    let config = prefix_router_sim::SimConfig {
        time_scale: 50.0,
        model: "m".into(),
        kv_events: Some(KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: "zmq".into(),
            endpoint: format!("tcp://127.0.0.1:{publish}"),
            replay_endpoint: Some(format!("tcp://127.0.0.1:{replay}")),
            topic: "kv".into(),
            ..KvEventsConfig::default()
        }),
        ..prefix_router_sim::SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = prefix_router_sim::start(config, listener).await.unwrap();
    let url = format!("http://{}", sim.addr);
    for user in ["first question ", "second question "] {
        let body = json!({"model": "m", "max_tokens": 2,
            "messages": [{"role": "user", "content": user.repeat(50)}]});
        let (status, _) = crate::support::post(&url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200);
    }
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{replay}"))
        .await
        .unwrap();
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&0u64.to_be_bytes()));
    dealer.send(request).await.unwrap();
    let (mut seqs, mut stored_tokens) = (Vec::new(), 0);
    loop {
        let reply = tokio::time::timeout(std::time::Duration::from_secs(10), dealer.recv())
            .await
            .expect("a reply within 10 s")
            .unwrap();
        let frames: Vec<Bytes> = reply.into_vec();
        let seq = u64::from_be_bytes(frames[frames.len() - 2].as_ref().try_into().unwrap());
        if seq == u64::MAX {
            assert_eq!(frames.len(), 4);
            break;
        }
        assert_eq!((frames.len(), frames[1].as_ref()), (4, &b"kv"[..]));
        let batch = decode::batch(&frames[3]).unwrap();
        for event in &batch.events {
            if let Event::Stored(stored) = event {
                assert_eq!(stored.token_ids.len(), stored.hashes.len() * 16);
                assert_eq!((stored.block_size, stored.medium), (16, Medium::Gpu));
                stored_tokens += stored.token_ids.len();
            }
        }
        seqs.push(seq);
    }
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.len() >= 2, "{seqs:?}");
    let prompt = sim.stats().prompt_tokens as usize;
    assert!(
        stored_tokens > 0 && stored_tokens <= prompt,
        "{stored_tokens} of {prompt}"
    );
    sim.shutdown().await;
}

/// Simulated engines named `names`, publishing their KV events (token ids from Qwen3's
/// tokenizer) with `config` laid over each, behind a router in token mode that reads them.
async fn publishing(
    names: &[&str],
    config: prefix_router_sim::SimConfig,
) -> (
    Vec<prefix_router_sim::SimHandle>,
    Vec<String>,
    crate::support::TestRouter,
) {
    use crate::support::*;
    use prefix_router::config::Settings;
    use prefix_router_sim::kv_events::KvEventsConfig;
    let tokenizer = fixtures::tokenizer("qwen3");
    let model = prefix_router_sim::hf::HfModel::load(&tokenizer).expect("Qwen3's tokenizer loads");
    let model = std::sync::Arc::new(model);
    let mut listeners = Vec::new();
    for _ in names {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let http: Vec<u16> = (listeners.iter())
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    // One offset from each engine's HTTP port to its free PUB port (the router's template).
    let free = |p: i32| u16::try_from(p).ok().filter(|&p| p > 1024 && p < 65000);
    let offset = (1..200)
        .map(|i| i * 97)
        .find(|o| {
            http.iter().all(|&h| {
                free(i32::from(h) + o)
                    .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
            })
        })
        .expect("a free port offset");
    let mut sims = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let events = KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: "zmq".into(),
            endpoint: format!("tcp://127.0.0.1:{}", i32::from(http[i]) + offset),
            ..KvEventsConfig::default()
        };
        let config = prefix_router_sim::SimConfig {
            name: names[i].into(),
            model: "m".into(),
            tokenizer: Some(model.clone()),
            kv_events: Some(events),
            ..config.clone()
        };
        sims.push(prefix_router_sim::start(config, listener).await.unwrap());
    }
    let urls: Vec<String> = http
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let router = TestRouter::start(
        Settings {
            worker_urls: Some(urls.clone()),
            health_check_interval: Some(0.2),
            threads: Some(2),
            grace_period: Some(0.0),
            tokenizer: Some(tokenizer),
            kv_events: Some(format!("tcp://127.0.0.1:{{port{offset:+}}}")),
            ..Settings::default()
        },
        names.len(),
    );
    (sims, urls, router)
}

/// What `why` (a `POST /route` answer) says of the record of the backend at `url`.
fn record(why: &Value, url: &str) -> Value {
    (why["backends"].as_array().unwrap().iter())
        .find(|b| b["url"] == url)
        .map(|b| b["record"].clone())
        .unwrap_or_default()
}

/// `POST /route` for `body` on `router`.
async fn explain(router: &crate::support::TestRouter, body: &Value) -> Value {
    let url = format!("{}/route", router.admin_url);
    let resp = crate::support::client().post(url).json(body).send().await;
    resp.unwrap().json::<Value>().await.unwrap()
}

/// Waits until every backend's record of `router` is exact.
async fn records_exact(router: &crate::support::TestRouter, urls: &[String], body: &Value) {
    for _ in 0..200 {
        let why = explain(router, body).await;
        if urls.iter().all(|u| record(&why, u)["mode"] == "exact") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the records never became exact");
}
