//! Overload: the budget for buffered bodies under clients holding 32 MiB bodies, the
//! per-backend in-flight limit with the router's queue, shedding with Retry-After, and
//! places freed by clients that leave.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const HELD: usize = 32 << 20;
const BUDGET: usize = 256 << 20;

/// What a client holding a 32 MiB body got in the end.
#[derive(Debug, PartialEq)]
enum HeldStream {
    Answered,
    Shed,
    Other(String),
}

/// Sends a chat request announcing a 32 MiB body, all of it but the last bytes (as far as
/// the router reads it), then the rest once `release` is set; reads the answer meanwhile.
async fn hold(
    addr: String,
    release: Arc<AtomicUsize>,
    sent_all_but_end: Arc<AtomicUsize>,
) -> HeldStream {
    let stream = TcpStream::connect(&addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let prefix = br#"{"model":"m","messages":[{"role":"user","content":""#;
    let suffix = br#""}]}"#;
    let filler = HELD - prefix.len() - suffix.len();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: {HELD}\r\nConnection: close\r\n\r\n"
    );
    let writing = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        writer.write_all(prefix).await?;
        let piece = vec![b'x'; 64 << 10];
        let mut left = filler;
        while left > 0 {
            let n = left.min(piece.len());
            writer.write_all(&piece[..n]).await?;
            left -= n;
        }
        sent_all_but_end.fetch_add(1, SeqCst);
        while release.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writer.write_all(suffix).await?;
        std::io::Result::Ok(writer)
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), reader.read_to_end(&mut answer)).await;
    writing.abort();
    let text = String::from_utf8_lossy(&answer).into_owned();
    match (read, status_of(&text)) {
        (Ok(_), 200) => HeldStream::Answered,
        (Ok(_), 503)
            if text.to_ascii_lowercase().contains("retry-after:")
                && text.contains("\"overloaded\"") =>
        {
            HeldStream::Shed
        }
        (_, _) => HeldStream::Other(text.chars().take(300).collect()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_bodies_stay_within_the_budget_and_small_requests_still_pass() {
    let _heavy = heavy().await;
    let up = TestUpstream::start("a").await;
    let (mut command, url, admin) = router_binary();
    let mut child = command
        .args([
            "--worker-urls",
            &up.url(),
            "--max-buffered-bytes",
            &BUDGET.to_string(),
        ])
        .args([
            "--admission-timeout",
            "4",
            // Connecting is not what this tests: the test backend shares a loaded machine.
            "--connect-timeout",
            "30",
            "--health-check-interval",
            "0.2",
            "--threads",
            "2",
        ])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let question = chat(&[("user", "a small question".into())]);
    let small = || post(&url, "/v1/chat/completions", &question);
    let deadline = Instant::now() + Duration::from_secs(20);
    let serving = || async {
        let sent = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&question)
            .send()
            .await;
        sent.is_ok_and(|r| r.status() == 200)
    };
    while !serving().await {
        assert!(Instant::now() < deadline, "the router never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = rss_kib(child.id());
    let (release, pushed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let addr = url.trim_start_matches("http://").to_string();
    let holders: Vec<_> = (0..96)
        .map(|_| {
            tokio::spawn(hold(
                addr.clone(),
                Arc::clone(&release),
                Arc::clone(&pushed),
            ))
        })
        .collect();
    // Let the admitted ones push their bodies in, then ask small questions meanwhile.
    let settle = Instant::now() + Duration::from_secs(10);
    while pushed.load(SeqCst) < BUDGET / HELD - 1 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut peak = rss_kib(child.id());
    for _ in 0..20 {
        let started = Instant::now();
        let (status, _) = small().await;
        assert_eq!(status, 200);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a small request took {:?}",
            started.elapsed()
        );
        peak = peak.max(rss_kib(child.id()));
    }
    // Past the admission timeout every waiting holder is shed: none waits any more.
    let shed_by = Instant::now() + Duration::from_secs(20);
    loop {
        peak = peak.max(rss_kib(child.id()));
        let scrape = scrape(&admin).await;
        if sum(&scrape, "prefix_router_budget_waiting_requests", &[]) == 0.0 {
            break;
        }
        assert!(
            Instant::now() < shed_by,
            "holders still wait past the admission timeout"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    release.store(1, SeqCst);
    let mut outcomes = Vec::new();
    for h in holders {
        outcomes.push(h.await.unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
    let answered = outcomes
        .iter()
        .filter(|o| **o == HeldStream::Answered)
        .count();
    let shed = outcomes.iter().filter(|o| **o == HeldStream::Shed).count();
    let growth_mib = (peak.saturating_sub(before)) / 1024;
    eprintln!(
        "96 held 32 MiB bodies: {answered} answered, {shed} shed; router RSS {} MiB -> peak {} MiB (+{growth_mib} MiB, budget {} MiB)",
        before / 1024,
        peak / 1024,
        BUDGET >> 20
    );
    let others: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o, HeldStream::Other(_)))
        .collect();
    assert!(
        others.is_empty(),
        "held clients got neither an answer nor a 503: {others:?}"
    );
    assert!(
        (1..=BUDGET / HELD).contains(&answered),
        "{answered} answered"
    );
    assert_eq!(answered + shed, 96);
    assert!(
        growth_mib as usize <= (BUDGET >> 20) * 5 / 4,
        "RSS grew {growth_mib} MiB"
    );
    // Nothing accepted is lost: every answered body reached the backend whole.
    let whole = up
        .received()
        .iter()
        .filter(|r| r.body.len() == HELD)
        .count();
    assert_eq!(whole, answered);
}

async fn post_all(url: &str, n: usize) -> Vec<(u16, Option<String>, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let url = url.to_string();
            tokio::spawn(async move {
                let started = Instant::now();
                let body = chat(&[("user", format!("question {i} {}", "q".repeat(i * 41)))]);
                let resp = client()
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let retry = resp
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string());
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                if status == 503 {
                    assert_error(&body, "overloaded");
                }
                (status, retry, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_per_backend_holds_requests_in_the_router_and_sheds_past_the_queue() {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    a.set_reply(UpstreamReply::Slow(Duration::from_millis(400)));
    b.set_reply(UpstreamReply::Slow(Duration::from_millis(400)));
    let mut s = settings(&[&a, &b]);
    s.max_inflight_per_backend = Some(2);
    s.max_queued = Some(32);
    let router = TestRouter::start(s.clone(), 2);
    let results = post_all(&router.url, 20).await;
    assert!(results.iter().all(|r| r.0 == 200), "{results:?}");
    assert_eq!(a.count() + b.count(), 20);
    assert!(
        a.max_inflight() <= 2 && b.max_inflight() <= 2,
        "{} and {}",
        a.max_inflight(),
        b.max_inflight()
    );
    let scrape = router.metrics().await;
    // All but the first four waited (one that lost a slot to another waits again).
    assert!(sum(&scrape, "prefix_router_queue_wait_seconds_count", &[]) >= 16.0);
    drop(router);

    s.max_queued = Some(5);
    let router = TestRouter::start(s, 2);
    let results = post_all(&router.url, 20).await;
    let shed: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    let ok = results.iter().filter(|r| r.0 == 200).count();
    eprintln!(
        "limit 2 x 2 backends, queue of 5, 20 at once: {ok} answered, {} shed",
        shed.len()
    );
    assert_eq!(ok + shed.len(), 20);
    assert_eq!(shed.len(), 11, "{results:?}");
    for (_, retry, took) in shed {
        assert!(retry.is_some(), "no Retry-After");
        assert!(*took < Duration::from_millis(300), "shed after {took:?}");
    }
    let scrape = router.metrics().await;
    assert_eq!(
        sum(
            &scrape,
            "prefix_router_shed_total",
            &[("reason", "queue_full")]
        ),
        11.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_leave_the_queue_free_their_place() {
    let a = TestUpstream::start("a").await;
    a.set_reply(UpstreamReply::Slow(Duration::from_millis(1_500)));
    let mut s = settings(&[&a]);
    s.max_inflight_per_backend = Some(1);
    let router = TestRouter::start(s, 1);
    let url = router.url.clone();
    let busy = tokio::spawn(async move {
        post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", "first".into())]),
        )
        .await
    });
    router
        .wait_until("the first request is in flight", |r| r.inflight() == 1)
        .await;
    let body = serde_json::to_vec(&chat(&[("user", "waiting".into())])).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut leaving = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(router.url.trim_start_matches("http://"))
            .await
            .unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        leaving.push(stream);
    }
    router
        .wait_until("three requests wait in the queue", |r| {
            r.state().queue.len() == 3
        })
        .await;
    drop(leaving);
    router
        .wait_until("the queue is empty again", |r| r.state().queue.is_empty())
        .await;
    assert_eq!(busy.await.unwrap().0, 200);
    router
        .wait_until("nothing is in flight", |r| r.inflight() == 0)
        .await;
    assert_eq!(a.count(), 1, "the requests that left reached the backend");
    assert_eq!(router.state().budget.held(), 0);
}
