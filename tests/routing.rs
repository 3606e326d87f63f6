//! Routing: conversations follow their prefix, sessions stick, and neither the session header
//! nor the body's session params displace the conversation text.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::support::*;

/// Text unique to `seed`, about `len` bytes.
fn text(seed: &str, len: usize) -> String {
    let unit = format!("{seed} says something specific about topic {seed}. ");
    unit.repeat(len / unit.len() + 1)
}

/// The messages of turn `turn` (0-based) of conversation `conv`.
fn conversation(conv: usize, turn: usize) -> Vec<(&'static str, String)> {
    let mut messages = vec![("system", text(&format!("system-{conv}"), 2000))];
    for t in 0..=turn {
        messages.push(("user", text(&format!("user-{conv}-{t}"), 500)));
        if t < turn {
            messages.push(("assistant", text(&format!("answer-{conv}-{t}"), 300)));
        }
    }
    messages
}

async fn backend_of(router: &TestRouter, body: &Value) -> String {
    let (status, reply) = post(&router.url, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{reply}");
    reply["backend"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_conversations_follow_their_first_backend() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1], &ups[2]]), 3);
    let mut first: HashMap<usize, String> = HashMap::new();
    for turn in 0..5 {
        for conv in 0..6 {
            let backend = backend_of(&router, &chat(&conversation(conv, turn))).await;
            let expected = first.entry(conv).or_insert_with(|| backend.clone());
            assert_eq!(&backend, expected, "conversation {conv} turn {turn} moved");
        }
    }
    let spread: HashSet<&String> = first.values().collect();
    assert!(
        spread.len() >= 2,
        "all conversations on one backend: {first:?}"
    );
    assert_eq!(ups.iter().map(TestUpstream::count).sum::<usize>(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_header_keeps_a_conversation_together_whatever_follows_its_start() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1], &ups[2]]), 3);
    for session in ["s1", "s2", "s3", "s4"] {
        let mut seen = HashSet::new();
        for i in 0..5 {
            // One start, then texts that do not extend each other.
            let body = chat(&[
                ("user", text(&format!("{session}-start"), 100)),
                ("assistant", text(&format!("{session}-unrelated-{i}"), 400)),
            ]);
            let resp = client()
                .post(format!("{}/v1/chat/completions", router.url))
                .header("x-session-id", session)
                .json(&body)
                .send()
                .await
                .unwrap();
            let reply: Value = resp.json().await.unwrap();
            seen.insert(reply["backend"].as_str().unwrap().to_string());
        }
        assert_eq!(seen.len(), 1, "session {session} spread over {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_session_id_keeps_a_session_without_displacing_the_text() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1], &ups[2]]), 3);
    let mut seen = HashSet::new();
    for i in 0..5 {
        let mut body = chat(&[
            ("user", text("start", 100)),
            ("assistant", text(&format!("unrelated-{i}"), 400)),
        ]);
        body["session_params"] = json!({"session_id": "body-session"});
        seen.insert(backend_of(&router, &body).await);
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    // The text was routed on and recorded: its next turn, without any session id,
    // follows the prefix to the same backend.
    let mut messages = vec![
        ("user", text("start", 100)),
        ("assistant", text("unrelated-4", 400)),
    ];
    messages.push(("assistant", text("reply", 200)));
    messages.push(("user", text("follow-up", 200)));
    let follow = backend_of(&router, &chat(&messages)).await;
    assert!(
        seen.contains(&follow),
        "follow-up went to {follow}, session to {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_paths_go_to_a_healthy_backend() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1]]), 2);
    for _ in 0..4 {
        let resp = client()
            .get(format!("{}/version", router.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let paths: Vec<String> = ups
        .iter()
        .flat_map(|u| u.received())
        .map(|r| r.path)
        .collect();
    assert_eq!(paths, vec!["/version"; 4]);
    assert!(
        ups.iter().all(|u| u.count() > 0),
        "least load with rotating ties uses both"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_pooled_and_reused() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    for i in 0..20 {
        let body = chat(&[("user", text(&format!("pooled-{i}"), 300))]);
        assert_eq!(backend_of(&router, &body).await, "a");
    }
    // One pooled connection for requests, one for health checks; a little slack.
    assert!(
        up.connections() <= 4,
        "{} connections for 20 requests",
        up.connections()
    );
}

/// llama-server's `--metrics` page and `/props` with 2 slots of 8,192 tokens (the field
/// names of llama.cpp from llama-cpp-python 0.3.36).
const LLAMA_CPP_METRICS: &str = "# TYPE llamacpp:requests_processing gauge\n\
    llamacpp:requests_processing 0\n\
    # TYPE llamacpp:requests_deferred gauge\n\
    llamacpp:requests_deferred 0\n";
const LLAMA_CPP_PROPS: &str = r#"{"default_generation_settings":{"n_ctx":8192},
    "total_slots":2,"model_alias":"test-model"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_slots_are_read_and_new_conversations_fill_them_evenly() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    ups.iter()
        .for_each(|u| u.set_pages(LLAMA_CPP_METRICS, LLAMA_CPP_PROPS));
    let router = TestRouter::start(settings(&[&ups[0], &ups[1]]), 2);
    router
        .wait_until("both backends' slots are read", |r| {
            let fleet = r.state().fleet.snapshot();
            fleet
                .backends
                .iter()
                .all(|b| b.account.sequences() == Some(2))
        })
        .await;
    let workers = router.admin_json("/workers").await;
    for backend in workers["workers"].as_array().unwrap() {
        assert_eq!(
            (&backend["slots"], &backend["kv_tokens"]),
            (&json!(2), &json!(16384))
        );
    }
    // Four conversations opening with one long system prompt. With one shared KV pool the
    // prompt would keep them together; with a KV per slot each would take another's slot.
    let system = text("shared-system", 4000);
    for conv in 0..4 {
        let ask = text(&format!("user-{conv}"), 600);
        backend_of(&router, &chat(&[("system", system.clone()), ("user", ask)])).await;
    }
    assert_eq!(ups.map(|u| u.count()), [2, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_failed_turn_no_longer_counts_as_a_live_conversation() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let url = up.url();
    let live = || async {
        let scrape = router.metrics().await;
        sum(
            &scrape,
            "prefix_router_backend_live_conversations",
            &[("backend", &url)],
        )
    };
    backend_of(&router, &chat(&conversation(0, 0))).await;
    backend_of(&router, &chat(&conversation(1, 0))).await;
    assert_eq!(live().await, 2.0);
    // The engine refuses the next turn of conversation 0 (a prompt over its limit).
    up.set_reply(UpstreamReply::Status(400));
    let (status, _) = post(
        &router.url,
        "/v1/chat/completions",
        &chat(&conversation(0, 1)),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(live().await, 1.0);
    // A new conversation refused at once is not counted either; a failed exchange frees its own.
    post(
        &router.url,
        "/v1/chat/completions",
        &chat(&conversation(2, 0)),
    )
    .await;
    up.set_reply(UpstreamReply::Hangup);
    post(
        &router.url,
        "/v1/chat/completions",
        &chat(&conversation(1, 1)),
    )
    .await;
    assert_eq!(live().await, 0.0);
    // POST /route shows the working set and the conversation's home.
    up.set_reply(UpstreamReply::Json);
    backend_of(&router, &chat(&conversation(1, 2))).await;
    let explained = post(&router.admin_url, "/route", &chat(&conversation(1, 3)))
        .await
        .1;
    let backend = &explained["backends"][0];
    assert_eq!(
        (&backend["home"], &backend["live_conversations"]),
        (&json!(true), &json!(1))
    );
    assert!(
        backend["live_tokens"].as_u64().unwrap() > 500,
        "{explained}"
    );
}
