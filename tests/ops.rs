//! Operations: metrics that add up, reloads (good, malformed, and 20 of them under load),
//! worker names resolved, the systemd unit, readiness notification and graceful upgrade.

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

fn write_config(path: &PathBuf, workers: &[&Upstream]) {
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
    let up = Upstream::start("a").await;
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
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
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
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
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
async fn load(url: String, total: u64, concurrency: usize, seq: Arc<AtomicU64>) -> u64 {
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
        pool.push(Upstream::start(&format!("u{i}")).await);
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
    let total: usize = pool.iter().map(Upstream::count).sum();
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
    let up = Upstream::start("a").await;
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

// ---- the binary: systemd unit, readiness, graceful upgrade ----

const BIN: &str = env!("CARGO_BIN_EXE_prefix-router");
const UNIT: &str = include_str!("../systemd/prefix-router.service");

fn exec_start_args(config: &str, upgrade_socket: &str) -> Vec<String> {
    let line = UNIT
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let mut words = line
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect::<Vec<_>>();
    for w in &mut words {
        *w = w
            .replace("/etc/prefix-router/prefix-router.toml", config)
            .replace("/run/prefix-router/upgrade.sock", upgrade_socket);
    }
    words
}

#[test]
fn systemd_accepts_the_unit() {
    let dir = scratch_dir("unit");
    let unit = UNIT.replace("/usr/local/bin/prefix-router", BIN);
    let path = dir.join("prefix-router.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", path.to_str().unwrap()])
        .output()
        .expect("systemd-analyze must be installed (make test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn router_config(dir: &std::path::Path, workers: &[&Upstream]) -> (PathBuf, String, String) {
    let (data, admin) = (
        crate::support::free_loopback_addr().unwrap(),
        crate::support::free_loopback_addr().unwrap(),
    );
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_string();
    let urls: Vec<String> = workers.iter().map(|u| format!("\"{}\"", u.url())).collect();
    let text = format!(
        "host = \"127.0.0.1\"\nport = {}\nadmin_port = {}\nworker_urls = [{}]\nhealth_check_interval = 0.2\nthreads = 1\ngrace_period = 20\n",
        port(&data),
        port(&admin),
        urls.join(", ")
    );
    let path = dir.join("router.toml");
    std::fs::write(&path, text).unwrap();
    (
        path,
        format!("http://{data}"),
        dir.join("upgrade.sock").display().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_run_as_the_unit_runs_it_notifies_ready() {
    let up = Upstream::start("a").await;
    let scratch = socket_dir("notify");
    let dir = scratch.path();
    let (config, url, upgrade) = router_config(dir, &[&up]);
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let child = std::process::Command::new(BIN)
        .args(exec_start_args(config.to_str().unwrap(), &upgrade))
        .env("NOTIFY_SOCKET", &socket_path)
        .spawn()
        .unwrap();
    let child = Child(child);
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("no READY=1 within 30 s");
    let message = String::from_utf8_lossy(&buf[..n]);
    assert!(message.contains("READY=1"), "{message}");
    assert!(
        message.contains(&format!("MAINPID={}", child.0.id())),
        "{message}"
    );
    // Ready means the listener accepts.
    assert!(
        tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_ok()
    );
}

async fn wait_serving(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = match client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(&[("user", "ping".into())]))
            .send()
            .await
        {
            Ok(r) => (r.status().as_u16(), ()),
            Err(_) => (0, ()),
        };
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "router never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How an upgrade is started.
#[derive(Clone, Copy, PartialEq)]
enum Trigger {
    /// Start the new binary with `--upgrade`, then SIGQUIT the old one.
    Quit,
    /// SIGUSR2 the old one, which starts the new one itself (the systemd way).
    Usr2,
}

/// A directory for a test's Unix sockets, removed when dropped: under the system's
/// temporary directory, as a socket's path must stay within 108 bytes, which `target/tmp`
/// in a deep checkout may not.
fn socket_dir(name: &str) -> tempfile::TempDir {
    let prefix = format!("prefix-router-{name}-");
    tempfile::Builder::new().prefix(&prefix).tempdir().unwrap()
}

/// A datagram socket standing in for systemd's notify socket.
fn notify_socket(dir: &std::path::Path) -> (PathBuf, std::os::unix::net::UnixDatagram) {
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    (path, socket)
}

/// The MAINPID of the next READY=1 message.
fn next_ready_pid(socket: &std::os::unix::net::UnixDatagram) -> u32 {
    let mut buf = [0u8; 256];
    loop {
        let n = socket.recv(&mut buf).expect("no READY=1 within 30 s");
        let message = String::from_utf8_lossy(&buf[..n]).to_string();
        if message.contains("READY=1") {
            let pid = message.split("MAINPID=").nth(1).unwrap().trim();
            return pid.parse().unwrap();
        }
    }
}

async fn upgrade_under_load(trigger: Trigger) {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let scratch = socket_dir(if trigger == Trigger::Quit {
        "upgrade-quit"
    } else {
        "upgrade-usr2"
    });
    let dir = scratch.path();
    let (config, url, upgrade) = router_config(dir, &[&a, &b]);
    let (notify_path, notify) = notify_socket(dir);
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--upgrade-socket",
        &upgrade,
    ];
    let spawn = |extra: &[&str]| {
        let mut command = std::process::Command::new(BIN);
        command
            .args(args)
            .args(extra)
            .env("NOTIFY_SOCKET", &notify_path);
        Child(command.spawn().unwrap())
    };
    let mut old = spawn(&[]);
    assert_eq!(next_ready_pid(&notify), old.0.id());
    wait_serving(&url).await;
    let seq = Arc::new(AtomicU64::new(0));
    let traffic = tokio::spawn(load(url.clone(), 4_000, 16, Arc::clone(&seq)));
    while seq.load(SeqCst) < 500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = match trigger {
        Trigger::Quit => {
            assert!(!std::path::Path::new(&upgrade).exists());
            let new = spawn(&["--upgrade"]);
            // The new process listens on the upgrade socket for the old one's listeners.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !std::path::Path::new(&upgrade).exists() {
                assert!(
                    Instant::now() < deadline,
                    "no upgrade socket from the new process"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            signal(old.0.id(), "QUIT");
            Some(new)
        }
        Trigger::Usr2 => {
            signal(old.0.id(), "USR2");
            None
        }
    };
    let new_pid = tokio::task::spawn_blocking(move || next_ready_pid(&notify))
        .await
        .unwrap();
    assert_ne!(
        new_pid,
        old.0.id(),
        "the new process reports itself as the main one"
    );
    let failed = traffic.await.unwrap();
    assert_eq!(failed, 0, "requests failed across the upgrade");
    assert_eq!(a.count() + b.count(), 4_000 + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the old process did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "after".into())]),
    )
    .await;
    assert_eq!(status, 200, "the new process does not serve");
    signal(new_pid, "KILL");
    drop(started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_upgrade_under_load_loses_no_request() {
    upgrade_under_load(Trigger::Quit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_started_upgrade_on_sigusr2_loses_no_request() {
    upgrade_under_load(Trigger::Usr2).await;
}
