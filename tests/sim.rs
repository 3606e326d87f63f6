//! HTTP tests of the simulated vLLM backend, each against an in-process instance on 127.0.0.1:0.

use std::time::{Duration, Instant};

use prefix_router_sim::{SimConfig, SimHandle, start, template};
use serde_json::{Value, json};

async fn instance(config: SimConfig) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    start(config, listener).await.expect("start")
}

/// A fast instance: every delay divided by 1000.
fn fast() -> SimConfig {
    SimConfig {
        time_scale: 1000.0,
        name: "sim-test".into(),
        ..SimConfig::default()
    }
}

fn url(sim: &SimHandle, path: &str) -> String {
    format!("http://{}{path}", sim.addr)
}

async fn post(sim: &SimHandle, path: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url(sim, path))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json body"))
}

fn chat(system: &str, user: &str) -> Value {
    json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

fn long_system() -> String {
    (0..400)
        .map(|i| format!("Rule {i}: be helpful. "))
        .collect()
}

/// Expected cached tokens of `next` after `prev` ran: their common full blocks, capped so
/// the last token is computed.
fn expected_cached(prev: &Value, next: &Value) -> u64 {
    let a = template::render_chat(prev, true).unwrap();
    let b = template::render_chat(next, true).unwrap();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tokens = b.len().div_ceil(4);
    let blocks = (common / 64).min((tokens - 1) / 16);
    (blocks * 16) as u64
}

#[tokio::test]
async fn shared_prefix_is_reported_as_cached_tokens() {
    let sim = instance(fast()).await;
    let system = long_system();
    let first = chat(&system, "What is 2+2?");
    let (status, body) = post(&sim, "/v1/chat/completions", &first).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["system_fingerprint"], "sim-test");
    let second = chat(&system, "And 3+3?");
    let (_, body) = post(&sim, "/v1/chat/completions", &second).await;
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached, expected_cached(&first, &second));
    assert!(cached > 2_000 && cached < prompt, "{cached} of {prompt}");
    // The same prompt again: everything but the last block is cached.
    let (_, again) = post(&sim, "/v1/chat/completions", &second).await;
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, (prompt - 1) / 16 * 16);
    let stats = sim.stats();
    assert_eq!((stats.requests, stats.finished), (3, 3));
    sim.shutdown().await;
}

/// Splits an SSE body into its `data:` payloads.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn chat_stream_sends_headers_at_once_then_chunks_and_usage() {
    // 300 ms of overhead so that headers and first token are clearly apart.
    let sim = instance(SimConfig {
        prefill_overhead_ms: 300.0,
        decode_ms_per_token: 2.0,
        ..SimConfig::default()
    })
    .await;
    let mut body = chat("sys", "hi");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(20);
    let started = Instant::now();
    let mut response = reqwest::Client::new()
        .post(url(&sim, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let headers_at = started.elapsed();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-sim-instance"], "sim");
    let mut text = String::new();
    let mut first_chunk_at = None;
    while let Some(chunk) = response.chunk().await.unwrap() {
        first_chunk_at.get_or_insert(started.elapsed());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let first_chunk_at = first_chunk_at.unwrap();
    assert!(
        headers_at < Duration::from_millis(250),
        "headers after {headers_at:?}"
    );
    assert!(
        first_chunk_at >= Duration::from_millis(300),
        "first chunk after {first_chunk_at:?}"
    );
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content.len(), 20 * 4);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 20);
    assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length")
    );
    sim.shutdown().await;
}

async fn stream_text(sim: &SimHandle, path: &str, body: &Value) -> String {
    let response = reqwest::Client::new()
        .post(url(sim, path))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

#[tokio::test]
async fn completions_and_responses_stream_their_usage() {
    let sim = instance(fast()).await;
    let prompt = long_system();
    let body = json!({"prompt": prompt, "max_tokens": 3, "stream": true});
    stream_text(&sim, "/v1/completions", &body).await;
    let text = stream_text(&sim, "/v1/completions", &body).await;
    let data = sse_data(&text);
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["object"], "text_completion");
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 1_000
    );

    let body =
        json!({"instructions": prompt, "input": "hello", "max_output_tokens": 4, "stream": true});
    stream_text(&sim, "/v1/responses", &body).await;
    let text = stream_text(&sim, "/v1/responses", &body).await;
    assert!(text.starts_with("event: response.created\n"));
    let events: Vec<Value> = sse_data(&text)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas.len(), 16);
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert_eq!(completed["response"]["usage"]["output_tokens"], 4);
    assert!(
        completed["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 1_000
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn responses_non_streaming_shape() {
    let sim = instance(fast()).await;
    let body = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "max_output_tokens": 2});
    let (status, body) = post(&sim, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(
        body["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .len(),
        8
    );
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], 0);
    sim.shutdown().await;
}

/// The value of the sample of `name` in Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(&format!("{name}{{")))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test]
async fn metrics_match_the_reported_usage() {
    let sim = instance(fast()).await;
    let system = long_system();
    let (mut prompt, mut cached) = (0, 0);
    for question in ["a?", "b?", "c?"] {
        let (_, body) = post(&sim, "/v1/chat/completions", &chat(&system, question)).await;
        prompt += body["usage"]["prompt_tokens"].as_u64().unwrap();
        cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
    }
    let text = reqwest::get(url(&sim, "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        sample(&text, "vllm:prefix_cache_queries_total"),
        prompt as f64
    );
    assert_eq!(sample(&text, "vllm:prefix_cache_hits_total"), cached as f64);
    assert_eq!(sample(&text, "vllm:generation_tokens_total"), 15.0);
    assert_eq!(sample(&text, "vllm:request_success_total"), 3.0);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(sample(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.0);
    assert_eq!(sample(&text, "vllm:time_to_first_token_seconds_count"), 3.0);
    assert!(text.contains("model_name=\"meta-llama/Llama-3.1-8B-Instruct\""));
    let stats = sim.stats();
    assert_eq!((stats.prompt_tokens, stats.cached_tokens), (prompt, cached));
    sim.shutdown().await;
}

#[tokio::test]
async fn tokenize_matches_chat_prompt_tokens() {
    let sim = instance(fast()).await;
    let body = chat("sys", "count me");
    let (status, tokens) = post(&sim, "/tokenize", &body).await;
    assert_eq!(status, 200, "{tokens}");
    let count = tokens["count"].as_u64().unwrap();
    assert_eq!(tokens["tokens"].as_array().unwrap().len() as u64, count);
    assert_eq!(tokens["max_model_len"], 131_072);
    let (_, chat_body) = post(&sim, "/v1/chat/completions", &body).await;
    assert_eq!(chat_body["usage"]["prompt_tokens"].as_u64(), Some(count));
    let (_, plain) = post(
        &sim,
        "/tokenize",
        &json!({"model": "m", "prompt": "abcdefgh"}),
    )
    .await;
    assert_eq!(plain["count"], 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn health_models_and_errors() {
    let sim = instance(fast()).await;
    let client = reqwest::Client::new();
    let health = client.get(url(&sim, "/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(health.bytes().await.unwrap().is_empty());
    let models: Value = client
        .get(url(&sim, "/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "meta-llama/Llama-3.1-8B-Instruct");

    let bad = client
        .post(url(&sim, "/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(error["error"]["code"], 400);
    assert!(error["error"]["message"].is_string());

    let (status, error) = post(&sim, "/v1/chat/completions", &json!({"messages": "nope"})).await;
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (400, Some("messages"))
    );
    let huge = json!({"prompt": "x".repeat(600_000), "max_tokens": 10});
    let (status, error) = post(&sim, "/v1/completions", &huge).await;
    assert_eq!(status, 400);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length")
    );

    let missing = client.get(url(&sim, "/v2/nothing")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"]["code"], 404);
    let wrong = client
        .get(url(&sim, "/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    sim.shutdown().await;
}

#[tokio::test]
async fn prefill_time_follows_the_model() {
    // 30K uncached tokens at 30K tok/s + 20 ms = 1.02 simulated s = 10.2 ms at time scale 100.
    let sim = instance(SimConfig {
        time_scale: 100.0,
        ..SimConfig::default()
    })
    .await;
    let body = json!({"prompt": "y".repeat(120_000), "max_tokens": 1});
    let started = Instant::now();
    let (status, _) = post(&sim, "/v1/completions", &body).await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(10), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn many_concurrent_requests_queue_and_all_finish() {
    let config = SimConfig {
        max_num_seqs: 8,
        time_scale: 100.0,
        ..fast()
    };
    let sim = instance(config).await;
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (client, url) = (client.clone(), url(&sim, "/v1/chat/completions"));
        let body = json!({"max_tokens": 10, "stream": i % 2 == 0, "messages": [{"role": "user", "content": format!("{} {i}", long_system())}]});
        tasks.spawn(async move { client.post(url).json(&body).send().await?.text().await });
    }
    while let Some(result) = tasks.join_next().await {
        let text = result.unwrap().unwrap();
        assert!(text.contains("\"completion_tokens\":10"), "{text}");
    }
    let stats = sim.stats();
    assert_eq!((stats.finished, stats.running, stats.waiting), (200, 0, 0));
    assert_eq!(stats.kv_cache_usage, 0.0);
    assert!(stats.cached_tokens > 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_client_that_goes_away_releases_its_request() {
    let sim = instance(SimConfig {
        decode_ms_per_token: 50.0,
        ..SimConfig::default()
    })
    .await;
    let mut body = chat("sys", "long answer");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(10_000);
    let mut response = reqwest::Client::new()
        .post(url(&sim, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let _first = response.chunk().await.unwrap();
    assert_eq!(sim.stats().running, 1);
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sim.stats().running != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim.stats().running, 0);
    assert_eq!(sim.stats().finished, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_the_port_and_bad_config_is_refused() {
    let sim = instance(fast()).await;
    let addr = sim.addr;
    sim.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = start(
        SimConfig {
            time_scale: 0.0,
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn a_non_streaming_client_that_goes_away_releases_its_request() {
    let sim = instance(SimConfig {
        decode_ms_per_token: 50.0,
        ..SimConfig::default()
    })
    .await;
    let mut body = chat("sys", "long answer");
    body["max_tokens"] = json!(10_000);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(
        client
            .post(url(&sim, "/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .is_err()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while sim.stats().running != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim.stats().running, 0);
    sim.shutdown().await;
}
