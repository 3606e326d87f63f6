//! Health and retries: unhealthy backends get nothing until they recover; a refused
//! connection is retried on another backend.

use crate::support::*;

fn chat_n(i: usize) -> serde_json::Value {
    chat(&[(
        "user",
        format!(
            "request number {i} with its own text {}",
            "x".repeat(i * 37)
        ),
    )])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_backend_gets_nothing_until_it_recovers() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    b.set_healthy(false);
    let router = TestRouter::start(settings(&[&a, &b]), 1);
    for i in 0..10 {
        assert_eq!(
            post(&router.url, "/v1/chat/completions", &chat_n(i))
                .await
                .0,
            200
        );
    }
    assert_eq!((a.count(), b.count()), (10, 0));
    b.set_healthy(true);
    router
        .wait_until("b passes its check", |r| r.ready_backends() == 2)
        .await;
    for i in 10..20 {
        assert_eq!(
            post(&router.url, "/v1/chat/completions", &chat_n(i))
                .await
                .0,
            200
        );
    }
    assert!(b.count() > 0, "recovered backend got no traffic");
    a.set_healthy(false);
    router
        .wait_until("a is out", |r| r.ready_backends() == 1)
        .await;
    let before = a.count();
    for i in 20..30 {
        assert_eq!(
            post(&router.url, "/v1/chat/completions", &chat_n(i))
                .await
                .0,
            200
        );
    }
    assert_eq!(a.count(), before, "unhealthy backend got requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_retried_on_another_backend() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    let mut s = settings(&[&a, &b]);
    s.health_check_interval = Some(3600.0);
    s.policy = Some("round_robin".into());
    let router = TestRouter::start(s, 2);
    b.kill().await;
    for i in 0..10 {
        let (status, body) = post(&router.url, "/v1/chat/completions", &chat_n(i)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["backend"], "a");
    }
    assert_eq!(a.count(), 10);
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
}
