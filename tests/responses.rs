//! Stateful Responses behind 4 simulated vLLM instances and a router on `round_robin`
//! (which, left alone, would send each follow-up to the next backend): every request
//! naming a stored response (`previous_response_id`, `GET /v1/responses/{id}`) reaches the
//! backend that made it, learnt from the JSON answer or the stream's `response.created`,
//! and `POST /route` says so; once that backend is gone such a request gets 404
//! `response_not_found`. A response is found on its backend from the stream's first event,
//! while it still streams (to be cancelled, say).

use std::sync::Arc;

use prefix_router::config::Settings;
use prefix_router_sim::{SimConfig, SimHandle};
use serde_json::{Value, json};

use crate::support::*;

pub async fn sim() -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = SimConfig {
        time_scale: 1000.0,
        ..SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

/// Sends a Responses request; its status and the response id it made.
pub async fn respond(router: &str, body: &Value) -> (u16, Option<String>) {
    let response = client()
        .post(format!("{router}/v1/responses"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let start = text.find("\"id\":\"resp_").map(|at| at + 6);
    let id = start.and_then(|s| Some(text[s..s + text[s..].find('"')?].to_string()));
    (status, id)
}

pub fn requests(sims: &[SimHandle]) -> Vec<u64> {
    sims.iter().map(|s| s.stats().requests).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_reach_the_backend_that_made_their_response() {
    let sims = [sim().await, sim().await, sim().await, sim().await];
    let settings = Settings {
        worker_urls: Some(sims.iter().map(|s| format!("http://{}", s.addr)).collect()),
        policy: Some("round_robin".into()),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 4);
    let mut last = None;
    for chain in 0..4 {
        let before = requests(&sims);
        let first = json!({"model": "m", "store": true, "stream": chain % 2 == 0,
            "max_output_tokens": 4, "input": format!("chain {chain}: plan the work")});
        let (status, mut id) = respond(&router.url, &first).await;
        assert_eq!(status, 200);
        for turn in 0..5 {
            let previous = id.clone().expect("every answer names its response");
            let next = json!({"model": "m", "store": true, "stream": turn % 2 == 1,
                "max_output_tokens": 4, "previous_response_id": previous, "input": "go on"});
            let (status, made) = respond(&router.url, &next).await;
            assert_eq!(status, 200);
            id = made;
        }
        let after = requests(&sims);
        let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(
            moved.iter().filter(|&&n| n > 0).count(),
            1,
            "chain {chain}: every turn on one backend, got {moved:?}"
        );
        assert_eq!(moved.iter().sum::<u64>(), 6);
        let home = moved.iter().position(|&n| n > 0).unwrap();
        last = id.map(|id| (id, home));
    }
    let (id, home) = last.unwrap();
    let explain = format!("{}/route?path=/v1/responses", router.admin_url);
    let next = json!({"model": "m", "previous_response_id": id, "input": "go on"});
    let (status, explained) = post(&explain, "", &next).await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["backend"], format!("http://{}", sims[home].addr));
    let [a, b, c, d] = sims;
    let mut sims = vec![a, b, c, d];
    sims.remove(home).shutdown().await;
    router
        .wait_until("the backend is seen gone", |r| {
            r.state().fleet.ready(&[]).len() == 3
        })
        .await;
    let (status, body) = post(&router.url, "/v1/responses", &next).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("response_not_found"))
    );
    assert_eq!(
        post(&explain, "", &next).await.0,
        404,
        "explained as served"
    );
    let got = client()
        .get(format!("{}/v1/responses/{id}", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status().as_u16(), 404);
    let body: Value = got.json().await.unwrap();
    assert_eq!(body["error"]["code"], "response_not_found");
    let unknown = json!({"model": "m", "previous_response_id": "resp_never", "input": "go on"});
    assert_eq!(
        respond(&router.url, &unknown).await.0,
        200,
        "an id it never saw goes anywhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_still_streaming_is_found_on_its_backend() {
    let upstreams = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
        TestUpstream::start("d").await,
    ];
    let all: Vec<&TestUpstream> = upstreams.iter().collect();
    let settings = Settings {
        policy: Some("round_robin".into()),
        ..settings(&all)
    };
    let router = TestRouter::start(settings, 4);
    let gate = Arc::new(tokio::sync::Notify::new());
    for turn in 0..2 {
        for upstream in &upstreams {
            upstream.set_reply(UpstreamReply::Created { gate: gate.clone() });
        }
        let body = json!({"model": "m", "stream": true, "input": format!("plan {turn}")});
        let mut stream = (client().post(format!("{}/v1/responses", router.url)))
            .json(&body)
            .send()
            .await
            .unwrap();
        let mut created = String::new();
        while !created.contains("\n\n") {
            let chunk = stream.chunk().await.unwrap().expect("the created event");
            created.push_str(&String::from_utf8_lossy(&chunk));
        }
        let (_, rest) = created.split_once("\"id\":\"resp_").expect("an id");
        let name = &rest[..rest.find('"').unwrap()];
        for upstream in &upstreams {
            upstream.set_reply(UpstreamReply::Json);
        }
        let cancel = format!("/v1/responses/resp_{name}/cancel");
        assert_eq!(post(&router.url, &cancel, &json!({})).await.0, 200);
        let home = upstreams.iter().find(|u| u.name() == name).unwrap();
        let got: Vec<String> = (home.received().iter()).map(|r| r.path.clone()).collect();
        assert_eq!(got.last(), Some(&cancel), "turn {turn}: {got:?}");
        gate.notify_one();
        let rest = stream.text().await.unwrap();
        assert!(rest.contains("response.completed"), "{rest}");
    }
}
