//! The engine's own priorities: with a tenants file, each routed request carries its
//! priority to the engine as vLLM's `X-Vllm-Priority` header, so that an engine scheduling
//! by priority (`--scheduling-policy priority`, here the simulator's) admits `high` before
//! the `low` requests it queued, which the router cannot stop once they run.

use std::time::{Duration, Instant};

use prefix_router::config::Settings;
use prefix_router_sim::engine::Scheduling;
use prefix_router_sim::{SimConfig, SimHandle, start};
use serde_json::json;

use crate::support::*;
use crate::tenants::tenants_file;

/// A tenants file of one tenant keyed `sk-priority`, allowed every priority, with `extra`
/// lines at its top.
fn priority_file(name: &str, extra: &str) -> std::path::PathBuf {
    let file = format!(
        "{extra}\n[tenants.p]\nkeys = [\"{}\"]\nmax_priority = \"high\"\n",
        sha256_entry("sk-priority")
    );
    tenants_file(name, &file)
}

/// Posts a chat request of `priority` (and the client's own `X-Vllm-Priority`, if any)
/// asking `max_tokens`; its status.
async fn post(url: &str, priority: &str, engine: Option<&str>, max_tokens: u32) -> u16 {
    let body = json!({"model": "m", "max_tokens": max_tokens, "messages": [
        {"role": "user", "content": format!("a {priority} question")}
    ]});
    let mut request = (client().post(format!("{url}/v1/chat/completions")))
        .header("x-priority", priority)
        .bearer_auth("sk-priority")
        .json(&body);
    if let Some(engine) = engine {
        request = request.header("x-vllm-priority", engine);
    }
    request.send().await.unwrap().status().as_u16()
}

/// The `X-Vllm-Priority` each request `up` received carried, in order ("" for none).
fn engine_priorities(up: &TestUpstream) -> Vec<String> {
    (up.received().iter())
        .map(|r| {
            let value = r.headers.get("x-vllm-priority");
            value.map_or("", |v| v.to_str().unwrap()).to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_carries_its_priority_to_the_engine_with_a_tenants_file() {
    let sends = [
        ("high", None),
        ("normal", None),
        ("low", None),
        ("low", Some("-100")),
    ];
    let mut seen = Vec::new();
    for (name, extra) in [
        ("engine-priority", ""),
        ("engine-priority-off", "engine_priority = false"),
        ("no-tenants-file", ""),
    ] {
        let up = TestUpstream::start("a").await;
        let tenants = (name != "no-tenants-file").then(|| priority_file(name, extra));
        let settings = Settings {
            tenants_file: tenants,
            ..settings(&[&up])
        };
        let router = TestRouter::start(settings, 1);
        for (priority, engine) in sends {
            assert_eq!(post(&router.url, priority, engine, 1).await, 200);
        }
        seen.push(engine_priorities(&up));
    }
    assert_eq!(
        seen[0],
        ["-1", "0", "1", "1"],
        "the router's class, not the client's"
    );
    assert_eq!(
        seen[1],
        ["", "", "", "-100"],
        "off: the client's own, untouched"
    );
    assert_eq!(seen[2], seen[1], "without a tenants file nothing changes");
}

/// A simulated vLLM of one sequence at a time, admitting by `scheduling`, decoding at
/// 20 ms a token.
async fn one_sequence_engine(scheduling: Scheduling) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = SimConfig {
        max_num_seqs: 1,
        scheduling_policy: scheduling,
        decode_ms_per_token: 20.0,
        ..SimConfig::default()
    };
    start(config, listener).await.unwrap()
}

/// A gauge of the simulator's `/metrics`.
async fn gauge(sim: &SimHandle, name: &str) -> u64 {
    let url = format!("http://{}/metrics", sim.addr);
    let page = client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = page.lines().find(|l| l.starts_with(name));
    let value = line.and_then(|l| l.rsplit(' ').next()).unwrap_or("0");
    value.parse::<f64>().unwrap() as u64
}

/// Waits until the simulator runs one request and queues `waiting`.
async fn until_engine(sim: &SimHandle, waiting: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let running = gauge(sim, "vllm:num_requests_running").await;
        if (running, gauge(sim, "vllm:num_requests_waiting").await) == (1, waiting) {
            return;
        }
        let late = Instant::now() > deadline;
        assert!(!late, "the engine does not run one and queue {waiting}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Behind a router with the tenants file `extra`, an engine of one sequence admitting by
/// `scheduling` runs a long `low` request, then queues a `low` and a `high` one that
/// arrive in that order: which of the two ends first.
async fn first_of_two_queued(name: &str, extra: &str, scheduling: Scheduling) -> &'static str {
    let sim = one_sequence_engine(scheduling).await;
    let settings = Settings {
        worker_urls: Some(vec![format!("http://{}", sim.addr)]),
        // The router learns no hold in the test: the engine's queue decides.
        metrics_interval: Some(600.0),
        tenants_file: Some(priority_file(name, extra)),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 1);
    let url = router.url.clone();
    // 1.2 s running: time for both to reach the engine's queue on a busy machine.
    let running = tokio::spawn(async move { post(&url, "low", None, 60).await });
    let mut ends = tokio::task::JoinSet::new();
    for (waiting, priority) in [(0, "low"), (1, "high")] {
        until_engine(&sim, waiting).await;
        let url = router.url.clone();
        // 0.5 s each: the first ends well before the second is answered.
        ends.spawn(async move { (post(&url, priority, None, 25).await, priority) });
    }
    // Both wait in the engine, not in the router.
    until_engine(&sim, 2).await;
    assert_eq!(running.await.unwrap(), 200);
    let (status, first) = ends.join_next().await.unwrap().unwrap();
    assert_eq!(status, 200);
    let (status, _) = ends.join_next().await.unwrap().unwrap();
    assert_eq!(status, 200);
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_scheduling_by_priority_runs_high_before_the_low_it_queued_first() {
    let by_priority = first_of_two_queued("engine-by-priority", "", Scheduling::Priority).await;
    assert_eq!(by_priority, "high");
    let off = "engine_priority = false";
    let unmarked = first_of_two_queued("engine-unmarked", off, Scheduling::Priority).await;
    assert_eq!(
        unmarked, "low",
        "without the header the engine serves them in turn"
    );
    let fcfs = first_of_two_queued("engine-fcfs", "", Scheduling::Fcfs).await;
    assert_eq!(
        fcfs, "low",
        "an engine of first come, first served ignores it"
    );
}
