//! End-to-end: replay against a tiny fake OpenAI server on 127.0.0.1 and check
//! the report against what the server actually answered.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prefix_router_replay::{ReplayArgs, Synthetic, Workload, replay};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the fake server answered, per backend name: (requests, prompt, cached).
#[derive(Default, Debug)]
struct Tally {
    served: BTreeMap<String, (u64, u64, u64)>,
    failed: u64,
    with_session_header: u64,
    seen: u64,
}

impl Tally {
    fn total(&self) -> (u64, u64, u64) {
        self.served
            .values()
            .fold((0, 0, 0), |a, v| (a.0 + v.0, a.1 + v.1, a.2 + v.2))
    }
}

#[derive(Clone)]
struct FakeEngine {
    tally: Arc<Mutex<Tally>>,
    /// Answer 503 to every n-th request.
    fail_every: Option<u64>,
    /// Answer 429 with `Retry-After: 1` to every n-th request.
    limit_every: Option<u64>,
}

async fn start(fail_every: Option<u64>) -> (String, Arc<Mutex<Tally>>) {
    start_fake(FakeEngine {
        tally: Arc::default(),
        fail_every,
        limit_every: None,
    })
    .await
}

async fn start_fake(fake: FakeEngine) -> (String, Arc<Mutex<Tally>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let tally = fake.tally.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(connection(sock, fake.clone()));
        }
    });
    (url, tally)
}

/// Serves HTTP/1.1 keep-alive requests on one connection.
async fn connection(sock: TcpStream, fake: FakeEngine) {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_owned());
        }
        let header = |name: &str| {
            head.iter().find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; len];
        r.read_exact(&mut body).await.unwrap();
        let session = header("x-session-id").is_some();
        let reply = if head[0].starts_with("GET /metrics") {
            metrics(&fake)
        } else {
            complete(&fake, &body, session)
        };
        for part in reply {
            w.write_all(&part).await.unwrap();
            w.flush().await.unwrap();
        }
    }
}

/// Prometheus text with vLLM-style counters from the tally.
fn metrics(fake: &FakeEngine) -> Vec<Vec<u8>> {
    let (req, prompt, cached) = fake.tally.lock().unwrap().total();
    let text = format!(
        "# TYPE vllm:request_success_total counter\nvllm:request_success_total{{finished_reason=\"length\"}} {req}.0\n\
         vllm:prompt_tokens_total{{model_name=\"m\"}} {prompt}\nvllm:prefix_cache_queries_total {prompt}\n\
         vllm:prefix_cache_hits_total {cached}\n"
    );
    vec![response("200 OK", "text/plain", "", text.as_bytes())]
}

fn response(status: &str, ctype: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\n{extra}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A chat completion: prompt = body bytes / 4, cached = prompt / 2, backends alternate.
fn complete(fake: &FakeEngine, body: &[u8], session: bool) -> Vec<Vec<u8>> {
    let req: serde_json::Value = serde_json::from_slice(body).expect("valid JSON body");
    assert!(!req["messages"].as_array().unwrap().is_empty());
    let mut t = fake.tally.lock().unwrap();
    t.seen += 1;
    t.with_session_header += u64::from(session);
    let name = if t.seen.is_multiple_of(2) {
        "sim-a"
    } else {
        "sim-b"
    };
    if fake.limit_every.is_some_and(|n| t.seen.is_multiple_of(n)) {
        t.failed += 1;
        let extra = "retry-after: 1\r\n";
        return vec![response(
            "429 Too Many Requests",
            "application/json",
            extra,
            b"{}",
        )];
    }
    if fake.fail_every.is_some_and(|n| t.seen.is_multiple_of(n)) {
        t.failed += 1;
        let extra = format!("x-sim-instance: {name}\r\n");
        return vec![response(
            "503 Service Unavailable",
            "application/json",
            &extra,
            b"{}",
        )];
    }
    let prompt = body.len() as u64 / 4;
    let cached = prompt / 2;
    let e = t.served.entry(name.to_owned()).or_default();
    (e.0, e.1, e.2) = (e.0 + 1, e.1 + prompt, e.2 + cached);
    let usage = serde_json::json!({"prompt_tokens": prompt, "completion_tokens": 2,
        "total_tokens": prompt + 2, "prompt_tokens_details": {"cached_tokens": cached}});
    if req["stream"] == true {
        return stream(name, &usage);
    }
    let answer = serde_json::json!({"id": "x", "object": "chat.completion", "model": req["model"],
        "system_fingerprint": name, "choices": [{"index": 0, "message": {"role": "assistant",
        "content": "ok"}, "finish_reason": "length"}], "usage": usage});
    vec![response(
        "200 OK",
        "application/json",
        "",
        answer.to_string().as_bytes(),
    )]
}

/// SSE over chunked encoding, events split across writes.
fn stream(name: &str, usage: &serde_json::Value) -> Vec<Vec<u8>> {
    let chunk = |delta: serde_json::Value, usage: serde_json::Value| {
        let c = serde_json::json!({"id": "x", "object": "chat.completion.chunk", "system_fingerprint": name,
            "choices": if delta.is_null() { serde_json::json!([]) } else { serde_json::json!([{"index": 0, "delta": delta}]) },
            "usage": usage});
        format!("data: {c}\n\n")
    };
    let text = [
        chunk(
            serde_json::json!({"role": "assistant", "content": ""}),
            serde_json::Value::Null,
        ),
        chunk(serde_json::json!({"content": "o"}), serde_json::Value::Null),
        chunk(serde_json::json!({"content": "k"}), serde_json::Value::Null),
        chunk(serde_json::Value::Null, usage.clone()),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-sim-instance: {name}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let mut parts = vec![head.into_bytes()];
    for piece in text.as_bytes().chunks(37) {
        let mut p = format!("{:x}\r\n", piece.len()).into_bytes();
        p.extend_from_slice(piece);
        p.extend_from_slice(b"\r\n");
        parts.push(p);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    parts
}

/// The shared traces: `$REPLAY_TRACE_DIR`, else `shared/traces` beside the
/// crate (the real repo) or two levels up (a scratch crate).
fn trace_path(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os("REPLAY_TRACE_DIR").map(PathBuf::from),
        Some(root.join("../shared/traces")),
        Some(root.join("../../shared/traces")),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found; set REPLAY_TRACE_DIR"))
}

fn trace_args(url: &str, stream: bool) -> ReplayArgs {
    ReplayArgs {
        url: url.to_owned(),
        trace: Some(trace_path("conversation_trace.jsonl")),
        max_requests: Some(200),
        speedup: 1000.0,
        concurrency: 16,
        stream,
        quiet: true,
        ..ReplayArgs::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_replay_matches_what_the_server_returned() {
    let (url, tally) = start(None).await;
    let args = trace_args(&url, false);
    let workload = Workload::load(&args).unwrap();
    assert_eq!(workload.len(), 200);
    for stream in [false, true] {
        let before = tally.lock().unwrap().total();
        let args = ReplayArgs {
            stream,
            ..args.clone()
        };
        let report = replay(&args, &workload).await.unwrap();
        let t = tally.lock().unwrap();
        let (req, prompt, cached) = t.total();
        let (req, prompt, cached) = (req - before.0, prompt - before.1, cached - before.2);
        assert_eq!(
            (
                report.requests.sent,
                report.requests.ok,
                report.requests.failed
            ),
            (200, 200, 0)
        );
        assert_eq!(req, 200);
        assert_eq!(
            (report.tokens.prompt, report.tokens.cached),
            (prompt, cached)
        );
        assert!(close(
            report.hit_rate.unwrap(),
            cached as f64 / prompt as f64
        ));
        assert_eq!(report.bound, workload.bound_detail());
        assert_eq!(report.ttft_ms.is_some(), stream);
        assert_eq!(report.e2e_ms.unwrap().count, 200);
        let b = report.backends.as_ref().unwrap();
        assert_eq!(b.rows.len(), 2);
        assert_eq!(b.unattributed_requests, 0);
        for row in &b.rows {
            assert_eq!(row.requests, 100, "{}", row.name);
            assert!(close(row.request_share, 0.5));
            assert_eq!(
                row.uncached_prompt_tokens,
                row.prompt_tokens - row.cached_tokens
            );
        }
        let unc: u64 = b.rows.iter().map(|r| r.uncached_prompt_tokens).sum();
        assert_eq!(unc, prompt - cached);
        assert!(close(b.request_imbalance.unwrap(), 1.0));
        assert!(report.table().contains("sim-a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_backend_metrics() {
    let (url, tally) = start(Some(10)).await;
    let args = ReplayArgs {
        backend_metrics: vec![url.clone()],
        ..trace_args(&url, true)
    };
    let workload = Workload::load(&args).unwrap();
    let report = replay(&args, &workload).await.unwrap();
    let t = tally.lock().unwrap();
    assert_eq!(report.requests.failed, 20);
    assert_eq!(report.requests.errors.get("http_503"), Some(&20));
    assert_eq!(report.requests.ok, 180);
    let m = report.backend_metrics.as_ref().expect("metrics section");
    let (req, prompt, cached) = t.total();
    assert_eq!(m.rows.len(), 1);
    assert_eq!(m.rows[0].requests, req);
    assert_eq!(m.rows[0].uncached_prompt_tokens, prompt - cached);
    assert_eq!(report.tokens.prompt, prompt);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["requests"]["errors"]["http_503"], 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sessions_with_session_header() {
    let (url, tally) = start(None).await;
    let args = ReplayArgs {
        url: url.clone(),
        synthetic: Some(Synthetic::Agent),
        sessions: 4,
        max_context_tokens: 20_000,
        session_rate: 10.0,
        think_min: 0.01,
        think_max: 0.02,
        speedup: 10.0,
        send_session_header: true,
        quiet: true,
        ..ReplayArgs::default()
    };
    let workload = Workload::load(&args).unwrap();
    let report = replay(&args, &workload).await.unwrap();
    let n = workload.len() as u64;
    assert!(n > 4 * 3, "{n} requests");
    assert_eq!(report.requests.ok, n);
    assert_eq!(tally.lock().unwrap().with_session_header, n);
    assert!(close(report.bound.hit_rate, workload.bound()));

    let limited = ReplayArgs {
        max_requests: Some(5),
        ..args.clone()
    };
    let report = replay(&limited, &workload).await.unwrap();
    assert_eq!(report.requests.sent, 5);

    let no_time = ReplayArgs {
        duration: Some(0.0),
        ..args
    };
    let report = replay(&no_time, &workload).await.unwrap();
    assert_eq!((report.requests.sent, report.requests.ok), (0, 0));
    assert!(report.hit_rate.is_none() && report.e2e_ms.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_requests_are_sent_again_after_retry_after() {
    for retry in [false, true] {
        let (url, tally) = start_fake(FakeEngine {
            tally: Arc::default(),
            fail_every: None,
            limit_every: Some(4),
        })
        .await;
        let args = ReplayArgs {
            max_requests: Some(6),
            concurrency: 1,
            retry_rate_limited: retry,
            ..trace_args(&url, false)
        };
        let workload = Workload::load(&args).unwrap();
        let report = replay(&args, &workload).await.unwrap();
        let t = tally.lock().unwrap();
        if retry {
            assert_eq!((report.requests.ok, report.requests.failed), (6, 0));
            assert_eq!(t.seen, 7, "the 4th was sent twice");
        } else {
            assert_eq!((report.requests.ok, report.requests.failed), (5, 1));
            assert_eq!(report.requests.errors.get("http_429"), Some(&1));
            assert_eq!(t.seen, 6);
        }
    }
}
