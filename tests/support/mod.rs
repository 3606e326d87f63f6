//! Test support: real backends, the real router, and small HTTP helpers.
#![allow(dead_code)] // helpers serve several test modules; not every test uses all of them

pub mod fixtures;
pub mod logs;
pub mod router;
pub mod upstream;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use logs::Log;
pub use router::{TestRouter, metrics_text, router_binary, scrape, settings};
pub use upstream::{ReceivedRequest, TestUpstream, UpstreamReply};

/// A directory for a test's files, `name` and the process id under Cargo's directory for
/// integration tests' scratch files (`target/tmp`, which `cargo clean` removes), rather
/// than the system's temporary directory.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A loopback `host:port` with a port the OS just handed out (bound, then released), never
/// one handed out before in this process: tests start routers at once, and the OS may hand
/// a released port out again before the router it was for binds it, so that one test's
/// requests reach another test's router.
pub fn free_loopback_addr() -> std::io::Result<String> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1_000 {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.insert(addr.port()) {
            return Ok(addr.to_string());
        }
    }
    Err(std::io::Error::other(
        "no loopback port left that was not handed out",
    ))
}

/// A tenants file's entry for `key`: `sha256:<hex>`, computed by `sha256sum` (another
/// implementation than the router's).
pub fn sha256_entry(key: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(key.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let hex = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", hex.split_whitespace().next().unwrap())
}

/// Held for their whole run by the tests that load the machine most (the soak, the held
/// 32 MiB bodies, a real vLLM, the agents' CLIs) and by those that time the router (the
/// lab against real time), so that their figures are not each other's noise.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// Resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: 0 kB");
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// An HTTP client with a bounded timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A chat completions body for `messages` given as (role, content) pairs.
pub fn chat(messages: &[(&str, String)]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect();
    json!({"model": "test-model", "messages": messages, "max_tokens": 8})
}

/// POSTs `body` as JSON to `path`; returns the status and the response body.
pub async fn post(url: &str, path: &str, body: &Value) -> (u16, Value) {
    post_raw(url, path, serde_json::to_vec(body).unwrap()).await
}

/// POSTs `body` as it is written (its keys in their order) to `path`, as JSON; returns the
/// status and the response body.
pub async fn post_raw(url: &str, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.bytes().await.unwrap();
    (status, serde_json::from_slice(&text).unwrap_or(Value::Null))
}

/// POSTs a one-message streaming chat request to `url`; the response as it starts.
pub async fn post_stream(url: &str) -> reqwest::Result<reqwest::Response> {
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
}

/// Sends raw bytes to the router and reads the whole response (until close or timeout).
pub async fn raw(url: &str, request: &[u8]) -> String {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of a raw HTTP response.
pub fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Asserts an OpenAI-style error body with `code`.
pub fn assert_error(body: &Value, code: &str) {
    assert_eq!(body["error"]["code"], code, "body: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert!(body["error"]["type"].as_str().is_some());
}

/// Sum of the samples of `metric` whose labels include `labels`.
pub fn sum(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let matches = |s: &&prometheus_parse::Sample| {
        s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
    };
    let value = |s: &prometheus_parse::Sample| match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => 0.0,
    };
    scrape.samples.iter().filter(matches).map(value).sum()
}
