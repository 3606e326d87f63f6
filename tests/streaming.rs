//! Responses stream through: SSE events reach the client before the backend has finished.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_arrive_before_the_upstream_finishes() {
    let up = TestUpstream::start("a").await;
    let gate = Arc::new(Notify::new());
    up.set_reply(UpstreamReply::Sse {
        chunks: 5,
        gate: Arc::clone(&gate),
    });
    let router = TestRouter::start(settings(&[&up]), 1);
    let resp = post_stream(&router.url).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    let first = first.expect("first event held back").unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"chunk\":0"));
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains("\"chunk\":4") && rest.ends_with("data: [DONE]\n\n"),
        "{rest}"
    );
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_releases_its_load() {
    let up = TestUpstream::start("a").await;
    let gate = Arc::new(Notify::new());
    up.set_reply(UpstreamReply::Sse { chunks: 5, gate });
    let router = TestRouter::start(settings(&[&up]), 1);
    let resp = post_stream(&router.url).await.unwrap();
    let mut stream = resp.bytes_stream();
    let _ = stream.next().await;
    assert_eq!(router.inflight(), 1);
    drop(stream);
    router
        .wait_until("the aborted request is released", |r| r.inflight() == 0)
        .await;
}
