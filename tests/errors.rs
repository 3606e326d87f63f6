//! Every error case answers its status with the OpenAI error JSON, reaches no backend, and
//! leaves no load behind.

use crate::support::*;

fn small_limit(up: &TestUpstream) -> TestRouter {
    let mut s = settings(&[up]);
    s.max_body_bytes = Some(1000);
    TestRouter::start(s, 1)
}

async fn raw_status_and_body(url: &str, request: &str) -> (u16, serde_json::Value) {
    let response = raw(url, request.as_bytes()).await;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (
        status_of(&response),
        serde_json::from_str(body).unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_400() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let cases = [
        ("/v1/chat/completions", "{not json"),
        ("/v1/chat/completions", r#"{"messages": "hello"}"#),
        ("/v1/chat/completions", r#"{"messages": []}"#),
        ("/v1/completions", r#"{"model": "m"}"#),
        ("/v1/responses", r#"{"input": 5}"#),
    ];
    for (path, body) in cases {
        let resp = client()
            .post(format!("{}{path}", router.url))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{path} {body}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert_error(&resp.json().await.unwrap(), "invalid_body");
    }
    assert_eq!(up.count(), 0, "a rejected request reached the backend");
    assert_eq!(router.inflight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_gets_413_before_or_while_reading() {
    let up = TestUpstream::start("a").await;
    let router = small_limit(&up);
    let declared =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n";
    let (status, body) = raw_status_and_body(&router.url, declared).await;
    assert_eq!(status, 413);
    assert_error(&body, "body_too_large");
    let chunk = "x".repeat(600);
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let (status, body) = raw_status_and_body(&router.url, &chunked).await;
    assert_eq!(status, 413);
    assert_error(&body, "body_too_large");
    assert_eq!(up.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_gets_400() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let both = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let (status, _) = raw_status_and_body(&router.url, both).await;
    assert_eq!(status, 400);
    assert_eq!(up.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_backend_gets_503() {
    let router = TestRouter::start(settings(&[]), 0);
    let (status, body) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&[("user", "hi".into())]),
    )
    .await;
    assert_eq!(status, 503);
    assert_error(&body, "no_healthy_backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failure_gets_502_and_releases_load() {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Hangup);
    let router = TestRouter::start(settings(&[&up]), 1);
    let (status, body) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&[("user", "hi".into())]),
    )
    .await;
    assert_eq!(status, 502);
    assert_error(&body, "upstream_failed");
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_statuses_pass_through() {
    let up = TestUpstream::start("a").await;
    up.set_reply(UpstreamReply::Status(429));
    let router = TestRouter::start(settings(&[&up]), 1);
    let (status, _) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&[("user", "hi".into())]),
    )
    .await;
    assert_eq!(status, 429);
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
}
