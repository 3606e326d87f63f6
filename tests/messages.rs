//! The Messages API (`/v1/messages`) behind 4 simulated vLLM instances, with requests
//! shaped like Claude Code's: each session's turn 2 reaches turn 1's backend and is served
//! from its cache; two sessions share their system prompt in the index although each
//! one's attribution line differs; `count_tokens` goes to its conversation's backend and
//! is answered without generating; errors
//! come in Anthropic's shape.

use prefix_router::config::Settings;
use prefix_router_sim::{SimConfig, SimHandle};
use serde_json::{Value, json};

use crate::support::*;

async fn sim() -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = SimConfig {
        time_scale: 1000.0,
        ..SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

/// Turn 1 (or, with `reply`, turn 2) of session `s`, as Claude Code sends it.
fn turn(s: usize, reply: bool) -> Value {
    let billing = format!("x-anthropic-billing-header: cc_version=2.1.332.{s:x}; cch={s:05};");
    let system = "You are an interactive agent that helps with software engineering. ".repeat(40);
    let first = format!("session {s}: fix the failing build in crate number {s}. ").repeat(8);
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": first}]}),
        json!({"role": "system", "content": "Current date: 2026-12-06."}),
    ];
    if reply {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": "Reading the build log."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cargo build"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "error[E0425]: cannot find value"},
            {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]}));
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "stream": true,
        "system": [{"type": "text", "text": billing}, {"type": "text", "text": system}],
        "tools": [{"name": "Bash", "description": "Runs a command", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": format!(r#"{{"device_id":"d","session_id":"sess-{s}"}}"#)},
        "messages": messages})
}

/// Sends `body` to `path` as session `s`; the status and the answer's text.
async fn send(router: &str, path: &str, s: usize, body: &Value) -> (u16, String) {
    let response = client()
        .post(format!("{router}{path}"))
        .header("x-claude-code-session-id", format!("sess-{s}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn stats(sims: &[SimHandle]) -> Vec<(u64, u64)> {
    sims.iter()
        .map(|s| (s.stats().requests, s.stats().cached_tokens))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_session_stays_on_its_backend_and_hits_its_cache() {
    let sims = [sim().await, sim().await, sim().await, sim().await];
    let settings = Settings {
        worker_urls: Some(sims.iter().map(|s| format!("http://{}", s.addr)).collect()),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 4);
    let explain = |s: usize, body: Value| {
        let url = format!("{}/route?path=/v1/messages", router.admin_url);
        async move {
            let request = client()
                .post(url)
                .header("x-claude-code-session-id", format!("sess-{s}"));
            request
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let (status, answer) = send(&router.url, "/v1/messages?beta=true", 0, &turn(0, false)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("event: message_stop"), "{answer}");
    let other = explain(1, turn(1, false)).await;
    let shared = other["backends"].as_array().unwrap().iter();
    let matched = shared
        .filter_map(|b| b["matched_tokens"].as_u64())
        .max()
        .unwrap();
    assert!(
        matched > 500,
        "the system prompt is shared whatever the billing line: {other}"
    );
    assert_eq!(other["session"], "header:x-claude-code-session-id");
    for s in 1..4 {
        assert_eq!(
            send(&router.url, "/v1/messages", s, &turn(s, false))
                .await
                .0,
            200
        );
    }
    let mut homes = Vec::new();
    for s in 0..4 {
        let before = stats(&sims);
        let home = explain(s, turn(s, true)).await;
        let (status, _) = send(&router.url, "/v1/messages", s, &turn(s, true)).await;
        assert_eq!(status, 200);
        let after = stats(&sims);
        let moved: Vec<usize> = (0..4).filter(|&i| after[i].0 > before[i].0).collect();
        assert_eq!(moved.len(), 1, "session {s}: one backend");
        let i = moved[0];
        assert_eq!(home["backend"], format!("http://{}", sims[i].addr));
        assert_eq!(home["outcome"], "prefix_hit", "session {s}: {home}");
        homes.push(format!("http://{}", sims[i].addr));
        assert!(
            after[i].1 - before[i].1 > 500,
            "session {s}: turn 2 from the cache"
        );
    }
    let before = stats(&sims);
    let (status, counted) = send(&router.url, "/v1/messages/count_tokens", 2, &turn(2, true)).await;
    assert_eq!(status, 200, "{counted}");
    let counted: Value = serde_json::from_str(&counted).unwrap();
    assert!(counted["input_tokens"].as_u64().unwrap() > 500, "{counted}");
    assert_eq!(stats(&sims), before, "a count generates nothing");
    // Counted once the exchange's log line is written, after its answer.
    let counts = [("route", "count_tokens"), ("backend", homes[2].as_str())];
    let all = [("route", "count_tokens")];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut scrape = router.metrics().await;
    while sum(&scrape, "prefix_router_requests_total", &all) < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "count_tokens not counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        scrape = router.metrics().await;
    }
    assert_eq!(
        sum(&scrape, "prefix_router_requests_total", &counts),
        1.0,
        "its conversation's backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_messages_request_gets_anthropics_error_shape() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    for body in [
        json!({"model": "m", "messages": 5}),
        json!({"model": "m", "max_tokens": 4}),
    ] {
        let (status, answer) = post(&router.url, "/v1/messages", &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["type"], "error");
        assert_eq!(answer["error"]["type"], "invalid_request_error");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("messages")
        );
    }
    let (status, answer) = post(&router.url, "/v1/chat/completions", &json!({"model": "m"})).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!("invalid_body"))
    );
    assert_eq!(up.count(), 0, "nothing reached the backend");
}
