//! Traces: the router's spans as a real OTLP receiver decodes them (the official
//! `opentelemetry-proto` classes, in a venv `tests/otlp/setup.sh` makes), the trace context
//! the backend receives, and requests unaffected by a dead or slow collector.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prefix_router::config::Settings;
use serde_json::Value;

use crate::support::*;

/// The client's trace: its id and the span the router continues.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const SECRET_KEY: &str = "sk-do-not-export-7f3a";
const SECRET_TEXT: &str = "body text that stays out of spans";

/// An OTLP/HTTP receiver (tests/otlp/receiver.py); stops when dropped.
struct Receiver {
    child: Child,
    url: String,
}

impl Receiver {
    /// Starts one that answers each export `delay` seconds late.
    fn start(delay: f64) -> Receiver {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new(crate::support::fixtures::otlp_python())
            .arg(root.join("tests/otlp/receiver.py"))
            .args(["--delay", &delay.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        let stdout = child.stdout.take().unwrap();
        BufReader::new(stdout).read_line(&mut port).unwrap();
        let url = format!("http://127.0.0.1:{}", port.trim());
        Receiver { child, url }
    }

    async fn get(&self, path: &str) -> Value {
        let resp = client().get(format!("{}{path}", self.url)).send().await;
        resp.unwrap().json().await.unwrap()
    }

    /// The spans received, once at least `n` arrived (waits up to 15 s).
    async fn spans(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.get("/spans").await;
            let spans = spans.as_array().unwrap().clone();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn traced(ups: &[&TestUpstream], endpoint: &str) -> Settings {
    Settings {
        otlp_endpoint: Some(endpoint.to_string()),
        trace_sample_ratio: Some(1.0),
        trace_resource_attributes: Some(vec!["deployment.environment=test".into()]),
        ..settings(ups)
    }
}

/// POSTs a chat completion carrying the client's trace context and secrets.
async fn traced_chat(router: &TestRouter) -> u16 {
    let body = chat(&[
        ("system", "You are terse. ".repeat(40)),
        ("user", SECRET_TEXT.into()),
    ]);
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .header("authorization", format!("Bearer {SECRET_KEY}"))
        .header("x-api-key", SECRET_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

fn named<'s>(spans: &'s [Value], name: &str) -> &'s Value {
    let span = spans.iter().find(|s| s["name"] == name);
    span.unwrap_or_else(|| panic!("no span {name} in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_real_otlp_receiver_linked_under_the_clients_trace() {
    let receiver = Receiver::start(0.0);
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Usage {
        prompt: 120,
        cached: 96,
    });
    // A tenant whose key is the secret, so that admission's tenant paths run traced too.
    let tenants = scratch_dir("traced-tenants").join("tenants.toml");
    let entry = sha256_entry(SECRET_KEY);
    std::fs::write(&tenants, format!("[tenants.acme]\nkeys = [\"{entry}\"]\n")).unwrap();
    let settings = Settings {
        tenants_file: Some(tenants),
        ..traced(&[&up], &receiver.url)
    };
    let router = TestRouter::start(settings, 1);
    assert_eq!(traced_chat(&router).await, 200);
    let spans = receiver.spans(4).await;

    assert!(
        spans.iter().all(|s| s["trace_id"] == TRACE_ID),
        "{spans:#?}"
    );
    let server = named(&spans, "POST /v1/chat/completions");
    assert_eq!(server["parent_span_id"], CLIENT_SPAN);
    assert_eq!(server["kind"], 2, "server");
    let attributes = &server["attributes"];
    assert_eq!(attributes["http.response.status_code"], 200);
    assert_eq!(attributes["url.path"], "/v1/chat/completions");
    assert_eq!(server["resource"]["service.name"], "prefix-router");
    assert_eq!(server["resource"]["deployment.environment"], "test");
    for child in ["read body", "route", "upstream"] {
        assert_eq!(
            named(&spans, child)["parent_span_id"],
            server["span_id"],
            "{child}"
        );
    }
    let route = &named(&spans, "route")["attributes"];
    assert_eq!(route["prefix_router.policy"], "kv_aware");
    assert_eq!(route["prefix_router.outcome"], "placed");
    assert_eq!(route["prefix_router.index"], "text");
    assert_eq!(route["prefix_router.prefix.unit"], "bytes");
    assert!(
        route["prefix_router.prefix.total"].as_i64().unwrap() > 600,
        "{route}"
    );
    assert_eq!(route["prefix_router.backend"], up.addr.to_string());
    let upstream = named(&spans, "upstream");
    assert_eq!(upstream["kind"], 3, "client");
    let attributes = &upstream["attributes"];
    assert_eq!(attributes["http.response.status_code"], 200);
    assert_eq!(attributes["gen_ai.usage.input_tokens"], 120);
    assert_eq!(attributes["prefix_router.cached_tokens"], 96);
    assert!(
        attributes["prefix_router.time_to_first_byte_ms"]
            .as_f64()
            .unwrap()
            >= 0.0
    );

    // The backend's parent is the router's exchange span, in the client's trace.
    let received = up.received();
    let parent = received[0].headers["traceparent"].to_str().unwrap();
    let expected = format!("00-{TRACE_ID}-{}-01", upstream["span_id"].as_str().unwrap());
    assert_eq!(parent, expected);
    // The body went as it came, and nothing secret went into a span.
    assert!(String::from_utf8_lossy(&received[0].body).contains(SECRET_TEXT));
    let exported = serde_json::to_string(&spans).unwrap();
    for secret in [SECRET_KEY, SECRET_TEXT, "authorization", "You are terse"] {
        assert!(!exported.contains(secret), "{secret} exported: {exported}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_request_shows_its_way_and_each_legs_span() {
    let receiver = Receiver::start(0.0);
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Body(
        r#"{"id":"x","kv_transfer_params":null}"#.into(),
    ));
    let decode = TestUpstream::start("d").await;
    let urls = |u: &TestUpstream| Some(vec![u.url()]);
    let settings = Settings {
        prefill: urls(&prefill),
        decode: urls(&decode),
        max_local_prefill_length: Some(0),
        ..traced(&[], &receiver.url)
    };
    let router = TestRouter::start(settings, 2);
    assert_eq!(traced_chat(&router).await, 200);
    let spans = receiver.spans(5).await;

    let server = named(&spans, "POST /v1/chat/completions");
    assert_eq!(
        server["attributes"]["prefix_router.disaggregation"],
        "split"
    );
    let mut legs: Vec<_> = (spans.iter().filter(|s| s["name"] == "upstream"))
        .map(|s| {
            let attributes = &s["attributes"];
            let leg = attributes["prefix_router.leg"].as_str().unwrap_or("none");
            let backend = attributes["prefix_router.backend"]
                .as_str()
                .unwrap_or("none");
            (leg.to_string(), backend.to_string())
        })
        .collect();
    legs.sort();
    let expected = [("decode", &decode), ("prefill", &prefill)]
        .map(|(leg, up)| (leg.to_string(), up.addr.to_string()));
    assert_eq!(legs, expected, "{spans:#?}");
    assert_eq!((prefill.count(), decode.count()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsampled_parent_is_followed_and_still_passed_on() {
    let receiver = Receiver::start(0.0);
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(traced(&[&up], &receiver.url), 1);
    let (status, _) = post(
        &router.url,
        "/v1/completions",
        &serde_json::json!({"prompt": "x"}),
    )
    .await;
    assert_eq!(status, 200);
    let resp = client()
        .post(format!("{}/v1/completions", router.url))
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-00"))
        .json(&serde_json::json!({"prompt": "y"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The unsampled request's context still reaches the backend, flagged unsampled.
    let received = up.received();
    let parent = received[1].headers["traceparent"].to_str().unwrap();
    assert!(
        parent.starts_with(&format!("00-{TRACE_ID}-")) && parent.ends_with("-00"),
        "{parent}"
    );
    assert!(!parent.contains(CLIENT_SPAN), "{parent}");
    // Only the first request's spans were exported, in a trace of their own.
    let spans = receiver.spans(4).await;
    assert_eq!(spans.len(), 4, "{spans:#?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.get("/spans").await.as_array().unwrap().len(), 4);
    assert!(
        spans.iter().all(|s| s["trace_id"] != TRACE_ID),
        "{spans:#?}"
    );
    let ours = received[0].headers["traceparent"].to_str().unwrap();
    assert!(
        spans
            .iter()
            .all(|s| ours.contains(s["trace_id"].as_str().unwrap()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_error_marks_the_exchange_and_the_request() {
    let receiver = Receiver::start(0.0);
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Status(500));
    let router = TestRouter::start(traced(&[&up], &receiver.url), 1);
    assert_eq!(traced_chat(&router).await, 500);
    let spans = receiver.spans(4).await;
    for name in ["POST /v1/chat/completions", "upstream"] {
        let span = named(&spans, name);
        assert_eq!(span["status"]["code"], "STATUS_CODE_ERROR", "{span}");
        assert_eq!(span["attributes"]["http.response.status_code"], 500);
    }
    assert_eq!(named(&spans, "route")["status"], serde_json::json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_traces_the_clients_context_reaches_the_backend_unchanged() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    assert_eq!(traced_chat(&router).await, 200);
    let parent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    assert_eq!(up.received()[0].headers["traceparent"], parent.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_backend_is_a_span_under_the_route() {
    let receiver = Receiver::start(0.0);
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Slow(Duration::from_millis(400)));
    let settings = Settings {
        max_inflight_per_backend: Some(1),
        ..traced(&[&up], &receiver.url)
    };
    let router = TestRouter::start(settings, 1);
    let (a, b) = tokio::join!(traced_chat(&router), traced_chat(&router));
    assert_eq!((a, b), (200, 200));
    let spans = receiver.spans(9).await;
    let wait = named(&spans, "wait");
    let routes: Vec<&Value> = spans.iter().filter(|s| s["name"] == "route").collect();
    assert!(
        routes
            .iter()
            .any(|r| r["span_id"] == wait["parent_span_id"]),
        "{spans:#?}"
    );
    let waited = wait["end"].as_u64().unwrap() - wait["start"].as_u64().unwrap();
    assert!(
        waited >= 300_000_000,
        "waited {waited} ns for a 400 ms answer"
    );
}

/// Counts of `prefix_router_trace_spans_total` by outcome.
async fn span_counts(router: &TestRouter) -> [f64; 3] {
    let scrape = router.metrics().await;
    let count = |o| {
        sum(
            &scrape,
            "prefix_router_trace_spans_total",
            &[("outcome", o)],
        )
    };
    [
        count("exported"),
        count("queue_full"),
        count("export_failed"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_costs_requests_nothing_and_its_spans_are_counted() {
    // A port held without listening: connections to it are refused.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = held.local_addr().unwrap();
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(traced(&[&up], &format!("http://{dead}")), 1);
    for _ in 0..20 {
        assert_eq!(traced_chat(&router).await, 200);
    }
    assert_eq!(up.count(), 20);
    let deadline = Instant::now() + Duration::from_secs(15);
    let failed = loop {
        let [exported, _, failed] = span_counts(&router).await;
        assert_eq!(exported, 0.0);
        if failed >= 80.0 || Instant::now() > deadline {
            break failed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(failed, 80.0, "four spans per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_collector_holds_no_request_and_a_full_queue_drops_spans() {
    // The receiver answers after the router's export timeout (10 s): the first export
    // hangs until then.
    let receiver = Receiver::start(30.0);
    let up = TestUpstream::start("a").await;
    let settings = Settings {
        trace_queue_size: Some(8),
        ..traced(&[&up], &receiver.url)
    };
    let router = TestRouter::start(settings, 1);
    // Requests go on while an export hangs in the collector, none of them waiting for it.
    let started = Instant::now();
    let mut n = 0;
    while n < 20 || started.elapsed() < Duration::from_millis(1500) {
        let sent = Instant::now();
        assert_eq!(traced_chat(&router).await, 200);
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "a request waited for the export"
        );
        n += 1;
    }
    let counts = receiver.get("/stats").await;
    assert!(counts["received"].as_u64() >= Some(1), "{counts}");
    assert_eq!(
        counts["answered"], 0,
        "every request answered before any export was"
    );
    let [_, dropped, _] = span_counts(&router).await;
    assert!(dropped > 0.0, "queue of 8 spans, {n} requests of 4");
}
