//! Operations: metrics that add up, reloads (good, malformed, and 20 of them under load)
//! and worker names resolved.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use prefix_router::config::Settings;
use prefix_router_sim::{SimConfig, SimHandle};
use serde_json::{Value as Json, json};

use crate::support::*;

/// Settings for a router whose worker list comes from its config file.
fn file_driven() -> Settings {
    Settings {
        worker_urls: None,
        ..settings(&[])
    }
}

fn write_config(path: &PathBuf, workers: &[&TestUpstream]) {
    let urls: Vec<String> = workers.iter().map(|u| format!("\"{}\"", u.url())).collect();
    std::fs::write(path, format!("worker_urls = [{}]\n", urls.join(", "))).unwrap();
}

async fn start_sim(name: &str) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = SimConfig {
        time_scale: 1000.0,
        name: name.into(),
        model: "test-model".into(),
        ..SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

/// Sends a chat request, streamed or not, and returns the usage the backend reported.
async fn usage_of(url: &str, body: &Json, stream: bool) -> (u64, u64) {
    let mut body = body.clone();
    body["stream"] = json!(stream);
    let resp = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let last = match stream {
        false => serde_json::from_str::<Json>(&text).unwrap(),
        true => text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Json>(d).ok())
            .rfind(|chunk| !chunk["usage"].is_null())
            .unwrap(),
    };
    let usage = &last["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (usage["prompt_tokens"].as_u64().unwrap(), cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_and_what_backends_reported() {
    let sims = [start_sim("s0").await, start_sim("s1").await];
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let router = TestRouter::start(
        Settings {
            worker_urls: Some(urls.clone()),
            ..settings(&[])
        },
        2,
    );
    let (mut prompt, mut cached) = (0, 0);
    for turn in 0..2 {
        for conv in 0..6 {
            let system = format!("conversation {conv} system prompt. ").repeat(100);
            let mut messages = vec![("system", system), ("user", "first question".to_string())];
            if turn == 1 {
                messages.push(("assistant", "an answer".into()));
                messages.push(("user", "a follow-up".into()));
            }
            let (p, c) = usage_of(&router.url, &chat(&messages), conv % 2 == 0).await;
            (prompt, cached) = (prompt + p, cached + c);
        }
    }
    assert!(cached > 0, "second turns should have hit the cache");
    let scrape = router.metrics().await;
    assert_eq!(
        sum(
            &scrape,
            "prefix_router_requests_total",
            &[("route", "chat"), ("status", "200")]
        ),
        12.0
    );
    assert_eq!(
        sum(
            &scrape,
            "prefix_router_decisions_total",
            &[("policy", "kv_aware")]
        ),
        12.0
    );
    for (sim, url) in sims.iter().zip(&urls) {
        let stats = sim.stats();
        let backend = [("backend", url.as_str())];
        assert_eq!(
            sum(&scrape, "prefix_router_requests_total", &backend),
            stats.requests as f64
        );
        assert_eq!(
            sum(
                &scrape,
                "prefix_router_backend_prompt_tokens_total",
                &backend
            ),
            stats.prompt_tokens as f64
        );
        assert_eq!(
            sum(
                &scrape,
                "prefix_router_backend_cached_tokens_total",
                &backend
            ),
            stats.cached_tokens as f64
        );
    }
    assert_eq!(
        sum(&scrape, "prefix_router_backend_prompt_tokens_total", &[]),
        prompt as f64
    );
    assert_eq!(
        sum(&scrape, "prefix_router_backend_cached_tokens_total", &[]),
        cached as f64
    );
    assert_eq!(sum(&scrape, "prefix_router_inflight_requests", &[]), 0.0);
    assert_eq!(sum(&scrape, "prefix_router_backend_healthy", &[]), 2.0);
    let stats: Json = reqwest::get(format!("{}/stats", router.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        stats["delivered_hit_rate"].as_f64().unwrap() > 0.0,
        "{stats}"
    );
    assert!(
        stats["predicted_hit_rate"].as_f64().unwrap() > 0.0,
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_answers_404_to_admin_paths() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    for path in ["/metrics", "/stats", "/workers", "/list_workers", "/reload"] {
        let resp = client()
            .get(format!("{}{path}", router.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        assert_error(&resp.json().await.unwrap(), "not_found");
    }
    let resp = client()
        .post(format!("{}/add_worker?url=http://1.2.3.4:1", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(up.count(), 0);
}

async fn reload(router: &TestRouter) -> u16 {
    let resp = client()
        .post(format!("{}/reload", router.admin_url))
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_config_on_reload_keeps_serving_the_old_one() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    let path = scratch_dir("reload").join("router.toml");
    write_config(&path, &[&a]);
    let router = TestRouter::start_from(file_driven(), Some(path.clone()), 1);
    std::fs::write(&path, "worker_urls = [\"http://ok:1\"\npolicy = 5").unwrap();
    assert_eq!(reload(&router).await, 400);
    std::fs::write(&path, "worker_urls = [\"not a url\"]\n").unwrap();
    assert_eq!(reload(&router).await, 400);
    for i in 0..5 {
        let (status, body) = post(
            &router.url,
            "/v1/chat/completions",
            &chat(&[("user", format!("q{i}"))]),
        )
        .await;
        assert_eq!((status, body["backend"].as_str()), (200, Some("a")));
    }
    let scrape = router.metrics().await;
    // Two refused by /reload; the file poll may also have tried a change before /reload did.
    let failed = sum(
        &scrape,
        "prefix_router_config_reloads_total",
        &[("result", "failed")],
    );
    assert!((2.0..=4.0).contains(&failed), "{failed} failed reloads");
    assert_eq!(sum(&scrape, "prefix_router_config_generation", &[]), 1.0);
    write_config(&path, &[&b]);
    assert_eq!(reload(&router).await, 200);
    router
        .wait_until("b is ready", |r| r.ready_backends() == 1)
        .await;
    let (status, body) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&[("user", "after".into())]),
    )
    .await;
    assert_eq!((status, body["backend"].as_str()), (200, Some("b")));
    assert_eq!(
        sum(
            &router.metrics().await,
            "prefix_router_config_generation",
            &[]
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_adds_and_removes_workers() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    let router = TestRouter::start(settings(&[&a]), 1);
    let admin = |path: String| client().post(format!("{}{path}", router.admin_url)).send();
    assert_eq!(
        admin(format!("/add_worker?url={}", b.url()))
            .await
            .unwrap()
            .status(),
        200
    );
    router
        .wait_until("b is ready", |r| r.ready_backends() == 2)
        .await;
    let list: Json = reqwest::get(format!("{}/list_workers", router.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["urls"], json!([a.url(), b.url()]));
    assert_eq!(
        admin(format!("/remove_worker?url={}", a.url()))
            .await
            .unwrap()
            .status(),
        200
    );
    let before = a.count();
    for i in 0..5 {
        let (status, body) = post(
            &router.url,
            "/v1/chat/completions",
            &chat(&[("user", format!("r{i}"))]),
        )
        .await;
        assert_eq!((status, body["backend"].as_str()), (200, Some("b")));
    }
    assert_eq!(a.count(), before);
    assert_eq!(
        admin("/remove_worker?url=http://10.9.9.9:1".into())
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        admin("/add_worker?url=ftp://x".into())
            .await
            .unwrap()
            .status(),
        400
    );
}

/// Which upstreams each of 20 changes leaves in the list (indexes into the pool of 5).
const CHANGES: [&[usize]; 20] = [
    &[0, 1, 2],
    &[1, 2],
    &[1, 2, 3],
    &[2, 3],
    &[3, 4],
    &[0, 3, 4],
    &[0, 4],
    &[0, 1],
    &[1, 2, 4],
    &[2, 4],
    &[0, 2],
    &[0, 2, 3],
    &[3],
    &[3, 4],
    &[1, 4],
    &[1, 2, 3, 4],
    &[0, 1],
    &[0, 3],
    &[2, 3],
    &[0, 1, 2, 3, 4],
];

/// Sends `total` requests, `concurrency` at a time, each tagged `x-seq` with the value of
/// `seq` when it was sent; returns the failures (printing the first few).
pub async fn load(url: String, total: u64, concurrency: usize, seq: Arc<AtomicU64>) -> u64 {
    let client = client();
    let work = futures_util::stream::iter(0..total).map(|i| {
        let (client, url, seq) = (client.clone(), url.clone(), Arc::clone(&seq));
        async move {
            let n = seq.fetch_add(1, SeqCst);
            let body = chat(&[(
                "user",
                format!("load request {i} {}", "x".repeat((i % 50) as usize)),
            )]);
            let sent = client
                .post(format!("{url}/v1/chat/completions"))
                .header("x-seq", n)
                .json(&body)
                .send()
                .await;
            let outcome = match sent {
                Ok(resp) if resp.status() == 200 => {
                    resp.bytes().await.map(drop).map_err(|e| e.to_string())
                }
                Ok(resp) => Err(format!("status {}", resp.status())),
                Err(e) => Err(format!("{e:?}")),
            };
            if let Err(e) = &outcome {
                eprintln!("request {n} failed: {e}");
            }
            outcome.is_err() as u64
        }
    });
    work.buffer_unordered(concurrency)
        .fold(0, |failed, f| async move { failed + f })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_lose_nothing_and_removed_backends_get_nothing_new() {
    let mut pool = Vec::new();
    for i in 0..5 {
        pool.push(TestUpstream::start(&format!("u{i}")).await);
    }
    let path = scratch_dir("reload-load").join("router.toml");
    write_config(&path, &[&pool[0], &pool[1]]);
    let router = TestRouter::start_from(file_driven(), Some(path.clone()), 2);
    let seq = Arc::new(AtomicU64::new(0));
    let traffic = tokio::spawn(load(router.url.clone(), 20_000, 32, Arc::clone(&seq)));
    // Per upstream, while it was out of the list: requests sent (seq) after the reload that
    // removed it returned must not reach it before the reload adding it back started.
    let mut out_since: HashMap<usize, u64> = HashMap::from([(2, 0), (3, 0), (4, 0)]);
    let mut forbidden: Vec<(usize, u64, Instant)> = Vec::new();
    for keep in CHANGES {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let start = Instant::now();
        for &i in keep {
            if let Some(since) = out_since.remove(&i) {
                forbidden.push((i, since, start));
            }
        }
        write_config(&path, &keep.iter().map(|&i| &pool[i]).collect::<Vec<_>>());
        assert_eq!(reload(&router).await, 200);
        let returned = seq.load(SeqCst);
        for i in (0..5).filter(|i| !keep.contains(i)) {
            out_since.entry(i).or_insert(returned);
        }
    }
    let failed = traffic.await.unwrap();
    assert_eq!(failed, 0, "requests failed during reloads");
    let end = Instant::now();
    forbidden.extend(out_since.into_iter().map(|(i, since)| (i, since, end)));
    for (i, from, until) in forbidden {
        for r in pool[i].received() {
            let n: u64 = r.headers["x-seq"].to_str().unwrap().parse().unwrap();
            assert!(
                !(from <= n && r.at < until),
                "u{i} got request {n}, sent after its removal (seq {from})"
            );
        }
    }
    let total: usize = pool.iter().map(TestUpstream::count).sum();
    assert_eq!(total, 20_000);
    assert_eq!(
        sum(
            &router.metrics().await,
            "prefix_router_config_generation",
            &[]
        ),
        21.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_host_names_are_resolved() {
    let up = TestUpstream::start("a").await;
    let url = format!("http://localhost:{}", up.addr.port());
    let router = TestRouter::start(
        Settings {
            worker_urls: Some(vec![url]),
            ..settings(&[])
        },
        1,
    );
    let (status, body) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&[("user", "hi".into())]),
    )
    .await;
    assert_eq!((status, body["backend"].as_str()), (200, Some("a")));
    let workers: Json = reqwest::get(format!("{}/workers", router.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let addresses: Vec<&str> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["address"].as_str())
        .collect();
    assert!(
        addresses.contains(&up.addr.to_string().as_str()),
        "{workers}"
    );
}
