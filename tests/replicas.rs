//! Router replicas behind a balancer that spreads requests in turn: with a shared table on
//! a real Redis server, each conversation keeps one backend whichever replica a turn
//! reaches, and each stored response is found where it was made.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// A `redis-server` on a free loopback port, killed on drop.
struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    fn start() -> RedisServer {
        RedisServer::start_on(free_loopback_addr().unwrap())
    }

    /// A server on `addr` (`host:port`).
    fn start_on(addr: String) -> RedisServer {
        let port = addr.rsplit_once(':').unwrap().1.to_string();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (make test-deps installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer {
            child,
            url: format!("redis://{addr}"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn metric(router: &TestRouter, name: &str, labels: &[(&str, &str)]) -> f64 {
    sum(&router.metrics().await, name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_table_keep_each_conversation_on_one_backend() {
    let redis = RedisServer::start();
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
        TestUpstream::start("d").await,
    ];
    let mut s = settings(&ups.iter().collect::<Vec<_>>());
    s.shared_table = Some(redis.url.clone());
    let replicas = [TestRouter::start(s.clone(), 4), TestRouter::start(s, 4)];
    for r in &replicas {
        wait_connected(r, true).await;
    }
    // The second replica has seen other traffic: on its own, it would break ties and
    // weigh backends differently from the first.
    for other in 0..3 {
        let text = format!("unrelated request {other}: {}", "summarize ".repeat(200));
        let (status, _) = post(
            &replicas[1].url,
            "/v1/chat/completions",
            &chat(&[("user", text)]),
        )
        .await;
        assert_eq!(status, 200);
    }
    let prompt = "You are a coding agent. Follow the repository's conventions. ".repeat(60);
    for conversation in 0..8 {
        let first = format!(
            "conversation {conversation}: {}",
            "fix the failing test ".repeat(30)
        );
        let mut messages = vec![("system", prompt.clone()), ("user", first)];
        for turn in 0..6 {
            // A balancer in front of the replicas: each turn to the next replica.
            let router = &replicas[(conversation + turn) % 2];
            let other = &replicas[(conversation + turn + 1) % 2];
            let received = [("direction", "received")];
            let before = metric(other, "prefix_router_shared_table_notes_total", &received).await;
            let (status, _) = post(&router.url, "/v1/chat/completions", &chat(&messages)).await;
            assert_eq!(status, 200);
            // The next turn comes after a generation, long after the note arrived: wait
            // for it (bounded), as a loaded test machine may take longer than a reply.
            let deadline = Instant::now() + Duration::from_secs(5);
            while metric(other, "prefix_router_shared_table_notes_total", &received).await <= before
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let answer = format!(
                "turn {turn} of {conversation}: {}",
                "edited a file ".repeat(50)
            );
            messages.push(("assistant", answer));
            messages.push(("user", format!("tool result {turn}: {}", "ok ".repeat(100))));
        }
    }
    for conversation in 0..8 {
        let marker = format!("conversation {conversation}: ");
        let homes: BTreeSet<&str> = (ups.iter())
            .filter(|u| {
                u.received()
                    .iter()
                    .any(|r| contains(&r.body, marker.as_bytes()))
            })
            .map(|u| u.name())
            .collect();
        assert_eq!(
            homes.len(),
            1,
            "conversation {conversation} went to {homes:?}"
        );
    }
    for r in &replicas {
        assert!(
            metric(
                r,
                "prefix_router_shared_table_notes_total",
                &[("direction", "sent")]
            )
            .await
                >= 24.0
        );
        assert!(
            metric(
                r,
                "prefix_router_shared_table_notes_total",
                &[("direction", "received")]
            )
            .await
                >= 24.0
        );
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Waits (bounded) until `router`'s subscription to the shared table is `connected`.
async fn wait_connected(router: &TestRouter, connected: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while (metric(router, "prefix_router_shared_table_connected", &[]).await >= 1.0) != connected {
        assert!(
            Instant::now() < deadline,
            "shared table never connected={connected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_keep_serving_while_redis_is_down_and_share_again_once_it_is_back() {
    let redis = RedisServer::start();
    let addr = redis.url.trim_start_matches("redis://").to_string();
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let mut s = settings(&ups.iter().collect::<Vec<_>>());
    s.shared_table = Some(redis.url.clone());
    let replicas = [TestRouter::start(s.clone(), 2), TestRouter::start(s, 2)];
    for r in &replicas {
        wait_connected(r, true).await;
    }
    drop(redis);
    for r in &replicas {
        wait_connected(r, false).await;
        let (status, _) = post(
            &r.url,
            "/v1/chat/completions",
            &chat(&[("user", "hi".into())]),
        )
        .await;
        assert_eq!(
            status, 200,
            "a replica stopped serving without its shared table"
        );
    }
    let _redis = RedisServer::start_on(addr);
    for r in &replicas {
        wait_connected(r, true).await;
    }
    let text = format!("after the restart: {}", "a question ".repeat(100));
    a_note_reaches(&replicas[0], &replicas[1], text).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_start_and_serve_without_redis_and_share_once_it_comes() {
    let addr = free_loopback_addr().unwrap();
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let mut s = settings(&ups.iter().collect::<Vec<_>>());
    s.shared_table = Some(format!("redis://{addr}"));
    let replicas = [TestRouter::start(s.clone(), 2), TestRouter::start(s, 2)];
    for r in &replicas {
        let (status, _) = post(
            &r.url,
            "/v1/chat/completions",
            &chat(&[("user", "hi".into())]),
        )
        .await;
        assert_eq!(
            status, 200,
            "a replica did not serve without its RedisServer"
        );
        assert_eq!(
            metric(r, "prefix_router_shared_table_connected", &[]).await,
            0.0
        );
    }
    let _redis = RedisServer::start_on(addr);
    for r in &replicas {
        wait_connected(r, true).await;
    }
    let text = format!("once RedisServer came: {}", "a question ".repeat(100));
    a_note_reaches(&replicas[0], &replicas[1], text).await;
}

/// A new conversation of `text` sent to `from` reaches `to` as a note (bounded: 10 s).
async fn a_note_reaches(from: &TestRouter, to: &TestRouter, text: String) {
    let received = [("direction", "received")];
    let notes = "prefix_router_shared_table_notes_total";
    let before = metric(to, notes, &received).await;
    let (status, _) = post(&from.url, "/v1/chat/completions", &chat(&[("user", text)])).await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(to, notes, &received).await <= before {
        assert!(
            Instant::now() < deadline,
            "no note reached the other replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_table_send_each_follow_up_where_its_response_lives() {
    use crate::responses::{requests, respond, sim};
    let redis = RedisServer::start();
    let sims = [sim().await, sim().await, sim().await, sim().await];
    let s = prefix_router::config::Settings {
        worker_urls: Some(sims.iter().map(|s| format!("http://{}", s.addr)).collect()),
        policy: Some("round_robin".into()),
        shared_table: Some(redis.url.clone()),
        ..settings(&[])
    };
    let replicas = [TestRouter::start(s.clone(), 4), TestRouter::start(s, 4)];
    for r in &replicas {
        wait_connected(r, true).await;
    }
    let first = serde_json::json!({"model": "m", "store": true, "input": "plan the work"});
    let (status, mut id) = respond(&replicas[0].url, &first).await;
    assert_eq!(status, 200);
    for turn in 1..=20 {
        let other = &replicas[turn % 2];
        let received = [("direction", "received")];
        let deadline = Instant::now() + Duration::from_secs(5);
        while metric(other, "prefix_router_shared_table_notes_total", &received).await
            < turn.div_ceil(2) as f64
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let next = serde_json::json!({"model": "m", "store": true, "input": "go on",
            "previous_response_id": id.expect("an id")});
        let (status, made) = respond(&other.url, &next).await;
        assert_eq!(status, 200, "follow-up {turn}");
        id = made;
    }
    let counts = requests(&sims);
    assert_eq!(counts.iter().filter(|&&n| n > 0).count(), 1, "{counts:?}");
    assert_eq!(
        counts.iter().sum::<u64>(),
        21,
        "20 of 20 follow-ups answered"
    );
}
