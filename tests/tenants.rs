//! Tenants: a request's tenant from the SHA-256 of its API key, 401 for keys the file does
//! not list, priorities clamped, and the rate limits answered with OpenAI's 429 and its
//! `x-ratelimit-*` headers; keys never in logs or metrics; `POST /route` says whose request
//! it is and whether it would wait.

use std::sync::Arc;
use std::time::Duration;

use prefix_router::config::Settings;
use serde_json::Value;
use tokio::sync::Notify;

use crate::support::*;

/// A router in front of `up` with the tenants file `text` (named after the test `name`).
fn with_tenants(up: &TestUpstream, name: &str, text: &str) -> TestRouter {
    let settings = Settings {
        tenants_file: Some(tenants_file(name, text)),
        ..settings(&[up])
    };
    TestRouter::start(settings, 1)
}

/// A tenants file of `text`, named after the test `name`.
pub fn tenants_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = scratch_dir("tenants");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

async fn send(
    router: &TestRouter,
    key: Option<&str>,
    priority: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat(&[("user", "a question for the fleet".into())]));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    if let Some(priority) = priority {
        request = request.header("x-priority", priority);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_name_tenants_and_unknown_keys_get_401_before_any_backend() {
    let up = TestUpstream::start("a").await;
    let file = format!(
        "[tenants.acme]\nkeys = [\"{}\"]\n",
        sha256_entry("sk-acme-secret")
    );
    let router = with_tenants(&up, "keys", &file);
    let (status, _, _) = send(&router, Some("sk-acme-secret"), Some("high")).await;
    assert_eq!(status, 200);
    assert_eq!(
        up.received()[0].headers["authorization"],
        "Bearer sk-acme-secret",
        "the key is forwarded as it came"
    );
    for key in [Some("sk-stranger"), None] {
        let (status, _, body) = send(&router, key, None).await;
        assert_eq!(status, 401, "{key:?}");
        assert_error(&body, "invalid_api_key");
    }
    let (status, _, body) = send(&router, Some("sk-acme-secret"), Some("urgent")).await;
    assert_eq!(status, 400);
    assert_error(&body, "invalid_priority");
    assert_eq!(up.count(), 1, "a refused request reached the backend");
    let metrics = router.metrics().await;
    assert_eq!(
        sum(&metrics, "prefix_router_unknown_api_keys_total", &[]),
        2.0
    );
    let admitted = [("tenant", "acme"), ("priority", "normal")];
    assert_eq!(
        sum(&metrics, "prefix_router_tenant_requests_total", &admitted),
        1.0,
        "high is clamped to acme's default cap, normal"
    );
    let text = metrics_text(&router.admin_url).await;
    assert!(
        !text.contains("sk-acme") && !text.contains("sk-stranger"),
        "a key reached the metrics"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_request_rate_gets_429_with_openai_headers() {
    let up = TestUpstream::start("a").await;
    let file = format!(
        "[tenants.acme]\nkeys = [\"{}\"]\nrequests_per_minute = 3\n\n[tenants.default]\n",
        sha256_entry("sk-acme")
    );
    let router = with_tenants(&up, "requests", &file);
    for _ in 0..3 {
        assert_eq!(send(&router, Some("sk-acme"), None).await.0, 200);
    }
    let (status, headers, body) = send(&router, Some("sk-acme"), None).await;
    assert_eq!(status, 429);
    assert_error(&body, "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    let header = |name: &str| headers[name].to_str().unwrap().to_string();
    assert_eq!(header("x-ratelimit-limit-requests"), "3");
    assert_eq!(header("x-ratelimit-remaining-requests"), "0");
    let retry: u64 = header("retry-after").parse().unwrap();
    assert!((55..=60).contains(&retry), "retry-after {retry}");
    assert!(header("x-ratelimit-reset-requests").ends_with('s'));
    assert_eq!(up.count(), 3);
    // The default tenant (no key) has no limit of its own.
    assert_eq!(send(&router, None, None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_counted_from_what_the_answers_report() {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Usage {
        prompt: 400,
        cached: 0,
    });
    let file = format!(
        "[tenants.acme]\nkeys = [\"{}\"]\ntokens_per_minute = 1000\n",
        sha256_entry("sk-acme")
    );
    let router = with_tenants(&up, "tokens", &file);
    // Each answer reports 400 prompt and 1 completion tokens, where the router estimated 6
    // from the text: after three (1,203 tokens) the minute's 1,000 are spent.
    for _ in 0..3 {
        assert_eq!(send(&router, Some("sk-acme"), None).await.0, 200);
    }
    // An answer is settled when its exchange ends, just after the client read its last
    // byte: wait (bounded) until all three are, so the fourth request sees them.
    let acme = [("tenant", "acme")];
    for _ in 0..100 {
        let metrics = router.metrics().await;
        if sum(&metrics, "prefix_router_tenant_tokens_total", &acme) >= 1203.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, headers, body) = send(&router, Some("sk-acme"), None).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "0");
    let metrics = router.metrics().await;
    let served = sum(&metrics, "prefix_router_tenant_tokens_total", &acme);
    assert_eq!(served, 1203.0);
    assert_eq!(
        sum(
            &metrics,
            "prefix_router_tenant_rate_limited_total",
            &[("limit", "tokens")]
        ),
        1.0
    );
}

/// Posts a chat request whose message is `name`, with `priority` (and the API key
/// `sk-priority`, which tenants files of these tests list); its status.
pub async fn post_named(url: String, name: &'static str, priority: &'static str) -> u16 {
    post_chat(url, chat(&[("user", name.into())]), priority).await
}

/// Posts `body` as a chat request with `priority`, as [`post_named`] does; its status.
async fn post_chat(url: String, body: Value, priority: &'static str) -> u16 {
    answer(&url, body, priority).await.status().as_u16()
}

/// The response to `body` posted as [`post_chat`] posts it, its body not read yet.
async fn answer(url: &str, body: Value, priority: &str) -> reqwest::Response {
    client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-priority", priority)
        .bearer_auth("sk-priority")
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// A router in front of `up` with one slot and a queue of one, for [`priority_tenants`]
/// `name`.
fn one_slot_router(up: &TestUpstream, name: &str) -> TestRouter {
    let settings = Settings {
        max_inflight_per_backend: Some(1),
        max_queued: Some(1),
        queue_timeout: Some(10.0),
        tenants_file: Some(priority_tenants(name)),
        ..settings(&[up])
    };
    TestRouter::start(settings, 1)
}

/// A tenants file `name` of one tenant, keyed `sk-priority`, allowed every priority.
fn priority_tenants(name: &str) -> std::path::PathBuf {
    let file = format!(
        "[tenants.p]\nkeys = [\"{}\"]\nmax_priority = \"high\"\n",
        sha256_entry("sk-priority")
    );
    tenants_file(name, &file)
}

/// How many `low` requests the router stopped.
async fn low_stopped(router: &TestRouter) -> f64 {
    let metrics = router.metrics().await;
    sum(
        &metrics,
        "prefix_router_tenant_preempted_total",
        &[("priority", "low")],
    )
}

/// The last message each request the backend received carried, in order.
pub fn arrivals(up: &TestUpstream) -> Vec<String> {
    (up.received().iter())
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            let last = body["messages"].as_array().and_then(|m| m.last());
            last.unwrap()["content"].as_str().unwrap().to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_serves_high_priority_first_and_sheds_low_first() {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Slow(Duration::from_millis(300)));
    let settings = Settings {
        max_inflight_per_backend: Some(1),
        max_queued: Some(3),
        queue_timeout: Some(10.0),
        ..settings(&[&up])
    };
    let router = TestRouter::start(settings, 1);
    let url = router.url.clone();
    let mut sent = Vec::new();
    for (name, priority) in [
        ("busy", "normal"),
        ("low", "low"),
        ("first normal", "normal"),
        ("second normal", "normal"),
        ("high", "high"),
    ] {
        sent.push(tokio::spawn(post_named(url.clone(), name, priority)));
        let queued = sent.len() - 1;
        router
            .wait_until("the request is placed or queued", |r| {
                up.count() == 1 && r.state().queue.len() >= queued.min(3)
            })
            .await;
    }
    let mut statuses = Vec::new();
    for s in sent {
        statuses.push(s.await.unwrap());
    }
    assert_eq!(
        statuses,
        vec![200, 503, 200, 200, 200],
        "low is shed for high"
    );
    assert_eq!(
        arrivals(&up),
        vec!["busy", "high", "first normal", "second normal"]
    );
}

/// A `high` request that would wait stops the `low` one in flight with no answer yet and
/// takes its slot; `low`, stopped, finds the queue full of `high` and gets 503 (nothing
/// was sent to its client); the next `high` waits for the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_high_stops_a_low_request_in_flight_rather_than_wait_for_it() {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Slow(Duration::from_millis(500)));
    let router = one_slot_router(&up, "displace");
    let url = router.url.clone();
    let low = tokio::spawn(post_named(url.clone(), "low", "low"));
    router
        .wait_until("low is placed", |_| up.count() == 1)
        .await;
    let first = tokio::spawn(post_named(url.clone(), "first high", "high"));
    router
        .wait_until("the first high took low's slot", |_| up.count() == 2)
        .await;
    let second = post_named(url.clone(), "second high", "high").await;
    assert_eq!(second, 200, "the second high waited for the slot");
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(
        low.await.unwrap(),
        503,
        "low, stopped, found the queue full"
    );
    assert_eq!(arrivals(&up), vec!["low", "first high", "second high"]);
    assert_eq!(low_stopped(&router).await, 1.0);
}

/// With no lower request left without an answer to stop, a `high` request that finds the
/// queue full of `high` waits past its bound while `low` runs, by at most as many
/// requests as `low` has in flight: the next `high` gets 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_request_waits_past_a_full_queue_for_a_low_one_that_already_answered() {
    let up = TestUpstream::start("a").await;
    let gate = Arc::new(Notify::new());
    up.set_reply(UpstreamReply::Sse {
        chunks: 2,
        gate: Arc::clone(&gate),
    });
    let router = one_slot_router(&up, "past-the-bound");
    let url = router.url.clone();
    let low = answer(&url, chat(&[("user", "low".into())]), "low").await;
    assert_eq!(low.status(), 200, "low answered, its stream held open");
    up.set_reply(UpstreamReply::Json);
    let mut highs = Vec::new();
    for (queued, name) in [(1, "first high"), (2, "second high")] {
        highs.push(tokio::spawn(post_named(url.clone(), name, "high")));
        router
            .wait_until("the high request waits", |r| {
                r.state().queue.len() == queued
            })
            .await;
    }
    let third = post_named(url.clone(), "third high", "high").await;
    assert_eq!(third, 503, "one past the bound, for the one low in flight");
    gate.notify_one();
    assert!(low.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    for high in highs {
        assert_eq!(high.await.unwrap(), 200);
    }
    assert_eq!(arrivals(&up), vec!["low", "first high", "second high"]);
    assert_eq!(low_stopped(&router).await, 0.0);
}

/// A `high` turn whose conversation's home is full of a `low` request with no answer
/// yet, while another backend is open, stops that request and takes its slot at home
/// rather than move; the stopped request is placed again on the other backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_turn_whose_home_is_full_stops_a_low_request_there_rather_than_move() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let settings = Settings {
        max_inflight_per_backend: Some(1),
        queue_timeout: Some(10.0),
        tenants_file: Some(priority_tenants("reclaim")),
        ..settings(&[&ups[0], &ups[1]])
    };
    let router = TestRouter::start(settings, 2);
    let url = router.url.clone();
    let system = ("system", "You review code for the fleet. ".repeat(40));
    let turn = |last: &str| {
        let mut messages = vec![system.clone(), ("user", "first question".to_string())];
        if last != "first" {
            messages.push(("assistant", "first answer".into()));
            messages.push(("user", last.into()));
        }
        chat(&messages)
    };
    assert_eq!(post_chat(url.clone(), turn("first"), "high").await, 200);
    let home = ups.iter().position(|u| u.count() == 1).unwrap();
    let (home, other) = (&ups[home], &ups[1 - home]);
    home.set_reply(UpstreamReply::Slow(Duration::from_millis(500)));
    // The first turn's slot is free once the router has closed its exchange, which on a
    // loaded machine can come a moment after the client had its status.
    router
        .wait_until("first is done", |r| r.inflight() == 0)
        .await;
    let low = tokio::spawn(post_chat(url.clone(), turn("low"), "low"));
    router
        .wait_until("low is placed at home", |_| home.count() == 2)
        .await;
    let explained = explain_as(&router, "sk-priority", "high", &turn("second")).await;
    assert_eq!(
        explained["admission"]["stops_at_home"],
        home.url(),
        "POST /route says so"
    );
    assert_eq!(post_chat(url.clone(), turn("second"), "high").await, 200);
    assert_eq!(low.await.unwrap(), 200, "low, stopped, was placed again");
    assert_eq!(
        arrivals(home),
        vec!["first question", "low", "second"],
        "high's turn stayed home"
    );
    assert_eq!(
        arrivals(other),
        vec!["low"],
        "the stopped request went elsewhere"
    );
    assert_eq!(low_stopped(&router).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_route_says_whose_request_it_is_and_whether_it_would_wait() {
    let up = TestUpstream::start("a").await;
    let file = format!(
        "standing_slots = 2\n[tenants.acme]\nkeys = [\"{}\"]\nmax_priority = \"high\"\n",
        sha256_entry("sk-acme")
    );
    let router = with_tenants(&up, "route", &file);
    let explain = |key| route_as(&router, key, "high", "test-model");
    let explained = explain("sk-acme").await;
    let admission = &explained["admission"];
    assert_eq!(admission["tenant"], "acme");
    assert_eq!(admission["priority"], "high");
    assert_eq!(admission["wait"], Value::Null, "the fleet has room");
    assert_eq!(admission["reserve"], false);
    assert_eq!(admission["stops_at_home"], Value::Null, "no home yet");
    assert_eq!(
        admission["standing_slots"], 2,
        "the file's, while no one else is active"
    );
    assert_eq!(explained["backend"], up.url());
    assert_eq!(explained["backends"][0]["open"], true);
    let refused = explain("sk-unknown").await;
    assert_eq!(refused["admission"]["refused"], "invalid_api_key");
    assert_eq!(up.count(), 0, "nothing was sent");
    // A request's tenant shows in the share gauges once it was served (its count may
    // still be 1 at the scrape: it ends after the client has the whole answer).
    assert_eq!(send(&router, Some("sk-acme"), None).await.0, 200);
    let text = metrics_text(&router.admin_url).await;
    assert!(text.contains("prefix_router_tenant_held_requests{tenant=\"acme\"}"));
    assert!(text.contains("prefix_router_queued_requests_by_priority{priority=\"high\"} 0"));
    assert!(!text.contains("sk-acme"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_active_for_the_files_active_after_past_its_last_request() {
    let up = TestUpstream::start("a").await;
    let file = format!(
        "active_after = 0.5\n[tenants.a]\nkeys = [\"{}\"]\n[tenants.b]\nkeys = [\"{}\"]\n",
        sha256_entry("sk-a"),
        sha256_entry("sk-b")
    );
    let router = with_tenants(&up, "active-after", &file);
    let leaves = || async {
        let explained = route_as(&router, "sk-a", "normal", "test-model").await;
        explained["admission"]["reserve"].as_bool().unwrap()
    };
    assert!(!leaves().await, "b was never active");
    let sent = std::time::Instant::now();
    assert_eq!(send(&router, Some("sk-b"), None).await.0, 200);
    // b's request counts until it ends (after its client has the answer), then b stays
    // active, below its share: a leaves it a reserve.
    while !leaves().await {
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "b never idle-active"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let active = std::time::Instant::now();
    while leaves().await {
        assert!(
            active.elapsed() < Duration::from_secs(4),
            "b active past 4 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "b idle {:?} after its request",
        sent.elapsed()
    );
}

/// What `POST /route` says of a chat request for `model` of the tenant keyed `key` at
/// `priority`.
async fn route_as(router: &TestRouter, key: &str, priority: &str, model: &str) -> Value {
    let mut body = chat(&[("user", "a question for the fleet".into())]);
    body["model"] = model.into();
    explain_as(router, key, priority, &body).await
}

/// What `POST /route` says of `body` sent by the tenant keyed `key` at `priority`.
pub async fn explain_as(router: &TestRouter, key: &str, priority: &str, body: &Value) -> Value {
    let response = client()
        .post(format!("{}/route", router.admin_url))
        .header("authorization", format!("Bearer {key}"))
        .header("x-priority", priority)
        .json(body)
        .send()
        .await
        .unwrap();
    response.json::<Value>().await.unwrap()
}

/// A chat request of the tenant keyed `key` asking `text`: its status and body.
pub async fn ask_as(url: String, key: &'static str, text: String) -> (u16, Value) {
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .json(
            &serde_json::json!({"model": prefix_router_sim::DEFAULT_MODEL,
            "max_tokens": 4, "messages": [{"role": "user", "content": text}]}),
        )
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenants_request_stops_a_heavy_ones_prefill_which_is_answered_after() {
    // A simulated vLLM instance prefilling 2,000 tokens a second: each heavy prompt of
    // about 4,000 tokens would take it 2 s alone, 6 s shared by three.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = prefix_router_sim::SimConfig {
        prefill_tokens_per_s: 2_000.0,
        ..Default::default()
    };
    let sim = prefix_router_sim::start(config, listener).await.unwrap();
    let file = format!(
        "[tenants.a]\nkeys = [\"{}\"]\n[tenants.b]\nkeys = [\"{}\"]\n",
        sha256_entry("sk-heavy"),
        sha256_entry("sk-light")
    );
    let settings = Settings {
        worker_urls: Some(vec![format!("http://{}", sim.addr)]),
        tenants_file: Some(tenants_file("preempt", &file)),
        max_inflight_per_backend: Some(8),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 1);
    let heavy: Vec<_> = (0..3)
        .map(|i| {
            let text = format!("heavy prompt {i}: ").repeat(1_000);
            tokio::spawn(ask_as(router.url.clone(), "sk-heavy", text))
        })
        .collect();
    let prefilling = |_: &TestRouter| sim.stats().running == 3;
    router
        .wait_until("the heavy requests prefill", prefilling)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let model = prefix_router_sim::DEFAULT_MODEL;
    let explained = route_as(&router, "sk-light", "normal", model).await;
    assert_eq!(
        explained["admission"]["kept"], true,
        "b is below its share: {explained}"
    );
    assert_eq!(
        explained["backends"][0]["would_stop"], 3,
        "POST /route says what it would stop, and stops nothing"
    );
    assert_eq!(
        route_as(&router, "sk-heavy", "normal", model).await["backends"][0]["would_stop"],
        0
    );
    let (status, _) = ask_as(router.url.clone(), "sk-light", "a short question".into()).await;
    assert_eq!(status, 200);
    assert_eq!(
        sim.stats().finished,
        1,
        "the light request was answered first"
    );
    let metrics = router.metrics().await;
    let stopped = sum(
        &metrics,
        "prefix_router_tenant_preempted_total",
        &[("tenant", "a")],
    );
    assert_eq!(stopped, 3.0, "every heavy request had no answer yet");
    for h in heavy {
        let (status, body) = h.await.unwrap();
        assert_eq!(status, 200, "nothing accepted is lost: {body}");
        let usage = &body["usage"];
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        assert!(
            0 < cached && cached < prompt / 2,
            "sent again, it found cached what its first prefill computed: {cached} of {prompt}"
        );
    }
    assert_eq!(
        sim.stats().requests,
        7,
        "3 heavy, the light, the 3 heavy again"
    );
}
