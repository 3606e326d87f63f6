//! Sick backends: one answering 500 to everything, one hanging up after reading the
//! request, one never answering, all ejected while clients get 200 from the others; a
//! stream cut after its first byte is not retried; retries stay within their budget; an
//! ejected backend that heals gets its traffic back; the router's own health on the data
//! port.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use prefix_router::config::Settings;

use crate::support::*;

/// `n` distinct one-turn conversations, sent `concurrency` at a time; their statuses.
async fn send(router: &TestRouter, n: usize, concurrency: usize) -> Vec<u16> {
    send_from(router, 0, n, concurrency).await
}

/// Conversations `first..first + n`, sent `concurrency` at a time; their statuses.
async fn send_from(router: &TestRouter, first: usize, n: usize, concurrency: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for batch in (first..first + n).collect::<Vec<_>>().chunks(concurrency) {
        let posts = batch.iter().map(|i| {
            let body = chat(&[("user", format!("question {i} of a fresh conversation"))]);
            async move { post(&router.url, "/v1/chat/completions", &body).await.0 }
        });
        statuses.extend(join_all(posts).await);
    }
    statuses
}

fn all_ok(statuses: &[u16]) -> bool {
    statuses.iter().all(|s| *s == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_500_to_everything_gets_almost_nothing_and_clients_get_200() {
    let (a, b, sick) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("sick").await,
    );
    sick.set_reply(UpstreamReply::Status(500));
    let router = TestRouter::start(settings(&[&a, &b, &sick]), 3);
    let statuses = send(&router, 300, 4).await;
    assert!(all_ok(&statuses), "{statuses:?}");
    eprintln!("the sick backend got {} of 300 requests", sick.count());
    assert!(sick.count() <= 10, "the sick backend got {}", sick.count());
    assert_eq!(a.count() + b.count(), 300);
    let metrics = router.metrics().await;
    let ejections = sum(
        &metrics,
        "prefix_router_backend_ejections_total",
        &[("reason", "5xx")],
    );
    assert_eq!(ejections, 1.0);
    let retried = sum(
        &metrics,
        "prefix_router_retries_total",
        &[("reason", "5xx")],
    );
    assert_eq!(retried as usize, sick.count());
    let workers = router.admin_json("/workers").await;
    let ejected: Vec<_> = (workers["workers"].as_array().unwrap().iter())
        .filter(|w| w["ejected"] == true)
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ejected, vec![sick.url()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_hangs_up_after_reading_the_request_costs_the_clients_nothing() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    b.set_reply(UpstreamReply::Hangup);
    let router = TestRouter::start(settings(&[&a, &b]), 2);
    let statuses = send(&router, 40, 2).await;
    assert!(all_ok(&statuses), "{statuses:?}");
    assert!(b.count() >= 1 && b.count() <= 4, "b got {}", b.count());
    let metrics = router.metrics().await;
    let retried = sum(
        &metrics,
        "prefix_router_retries_total",
        &[("reason", "reset")],
    );
    assert_eq!(retried as usize, b.count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_silent_before_its_first_byte_is_ejected_and_later_requests_do_not_wait() {
    let (a, silent) = (
        TestUpstream::start("a").await,
        TestUpstream::start("silent").await,
    );
    silent.set_reply(UpstreamReply::Silent);
    let settings = Settings {
        upstream_first_byte_timeout: Some(0.5),
        ..settings(&[&a, &silent])
    };
    let router = TestRouter::start(settings, 2);
    let statuses = send(&router, 12, 1).await;
    assert!(all_ok(&statuses), "{statuses:?}");
    // Ejected after passive_failures (3) timeouts; a passed health check may let one more
    // through half-open, which ejects it again, for good this time (twice as long).
    assert!((3..=4).contains(&silent.count()), "{}", silent.count());
    let mut waited = 0;
    for i in 100..120 {
        let started = Instant::now();
        assert!(all_ok(&send_from(&router, i, 1, 1).await));
        waited += usize::from(started.elapsed() >= Duration::from_millis(450));
    }
    assert!(
        waited <= 1,
        "{waited} requests waited for the first-byte timeout"
    );
    assert!(silent.count() <= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_first_byte_is_not_retried() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    a.set_reply(UpstreamReply::Cut);
    b.set_reply(UpstreamReply::Cut);
    let router = TestRouter::start(settings(&[&a, &b]), 2);
    let response = post_stream(&router.url).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.bytes().await.is_err(),
        "a cut stream read as complete"
    );
    assert_eq!(a.count() + b.count(), 1, "sent once");
    let metrics = router.metrics().await;
    assert_eq!(sum(&metrics, "prefix_router_retries_total", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_backend_failing_retries_stay_within_the_budget() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
    ];
    for up in &ups {
        up.set_reply(UpstreamReply::Silent);
    }
    let settings = Settings {
        upstream_first_byte_timeout: Some(1.0),
        passive_failures: Some(0),
        consecutive_5xx: Some(0),
        ..settings(&ups.iter().collect::<Vec<_>>())
    };
    let router = TestRouter::start(settings, 3);
    let statuses = send(&router, 30, 30).await;
    assert!(statuses.iter().all(|s| *s == 504), "{statuses:?}");
    let attempts: usize = ups.iter().map(TestUpstream::count).sum();
    let metrics = router.metrics().await;
    let retried = sum(&metrics, "prefix_router_retries_total", &[]) as usize;
    let refused = sum(&metrics, "prefix_router_retry_budget_exhausted_total", &[]) as usize;
    // 20% of 30 requests in progress: 6 of them may retry, each at most twice.
    assert!(retried <= 6 * 2, "{retried} retries");
    assert_eq!(attempts, 30 + retried);
    assert!(refused >= 24, "{refused} refused by the budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_backend_that_heals_gets_its_traffic_back() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    b.set_reply(UpstreamReply::Status(500));
    let settings = Settings {
        base_ejection_time: Some(1.0),
        ..settings(&[&a, &b])
    };
    let router = TestRouter::start(settings, 2);
    assert!(all_ok(&send(&router, 20, 1).await));
    let sick = b.count();
    assert!(sick >= 5);
    b.set_reply(UpstreamReply::Json);
    router
        .wait_until("b is back half-open", |r| r.ready_backends() == 2)
        .await;
    // New conversations: those of before live on `a` now, and would go back there.
    assert!(all_ok(&send_from(&router, 100, 20, 1).await));
    assert!(
        b.count() >= sick + 5,
        "b got {} after healing",
        b.count() - sick
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_port_answers_its_own_health_and_forwards_none_of_it() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    for path in ["/health", "/readiness", "/liveness", "/healthz"] {
        let response = client()
            .get(format!("{}{path}", router.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert!(
            response.headers().get("server").is_none(),
            "{path} was forwarded"
        );
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["ready_backends"], 1);
    }
    assert_eq!(up.count(), 0, "a probe reached the backend");
    up.set_healthy(false);
    router
        .wait_until("no backend ready", |r| r.ready_backends() == 0)
        .await;
    let get = |path: &'static str| client().get(format!("{}{path}", router.url)).send();
    assert_eq!(get("/health").await.unwrap().status(), 503);
    assert_eq!(get("/liveness").await.unwrap().status(), 200);
    assert_eq!(up.count(), 0);
}
