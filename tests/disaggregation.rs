//! Prefill/decode disaggregation through the real router, in front of real HTTP backends
//! listed with `prefill` and `decode`: what each leg's backend received, and what the
//! client got.

use serde_json::{Value, json};

use crate::support::*;

/// A prefill answer as vLLM's NixL connector gives it: one token, and where its blocks are.
const PREFILLED: &str = r#"{"id":"cmpl-p","object":"chat.completion","choices":[{"index":0,
"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],
"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}},
"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e1",
"remote_block_ids":[7,8],"remote_host":"127.0.0.1","remote_port":5600}}"#;

async fn fleet(prefill: &[&TestUpstream], decode: &[&TestUpstream]) -> TestRouter {
    let urls = |u: &[&TestUpstream]| Some(u.iter().map(|u| u.url()).collect());
    let settings = prefix_router::config::Settings {
        prefill: urls(prefill),
        decode: urls(decode),
        // Every prompt here is short: none is computed on its decode instance.
        max_local_prefill_length: Some(0),
        ..settings(&[])
    };
    TestRouter::start(settings, prefill.len() + decode.len())
}

fn body_of(request: &ReceivedRequest) -> Value {
    serde_json::from_slice(&request.body).unwrap()
}

fn conversation(stream: bool) -> Value {
    json!({"model": "m", "max_tokens": 64, "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "You are a careful coding agent."},
                     {"role": "user", "content": "Read the repository and fix the failing test."}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_prefilled_on_one_instance_and_decoded_on_another() {
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Body(PREFILLED.into()));
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&prefill], &[&decode]).await;
    let (status, answer) = post(&router.url, "/v1/chat/completions", &conversation(false)).await;
    assert_eq!((status, answer["backend"].as_str()), (200, Some("d")));

    let [leg] = prefill.received().try_into().unwrap();
    assert_eq!(leg.path, "/v1/chat/completions");
    let sent = body_of(&leg);
    assert_eq!(
        (sent["max_tokens"].as_u64(), sent["stream"].as_bool()),
        (Some(1), Some(false))
    );
    assert!(sent.get("stream_options").is_none(), "{sent}");
    assert_eq!(sent["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(sent["messages"], conversation(false)["messages"]);

    let [leg] = decode.received().try_into().unwrap();
    let sent = body_of(&leg);
    let mut expected = conversation(false);
    expected["kv_transfer_params"] = json!({"do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": "e1", "remote_block_ids": [7, 8], "remote_host": "127.0.0.1",
        "remote_port": 5600});
    assert_eq!(
        sent, expected,
        "the client's request, with the prefill's parameters"
    );
    let length = leg.headers["content-length"].to_str().unwrap();
    assert_eq!(length, leg.body.len().to_string());
}

/// A client's body as an agent sends it: tool schemas whose keys are not in sorted order.
const AGENT_BODY: &str = r#"{"model":"m","stream":true,"max_tokens":64,
"tools":[{"type":"function","function":{"name":"read","description":"Read a file",
"parameters":{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},
"required":["path"]}}}],
"messages":[{"role":"user","content":"Read src/main.rs"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_legs_carry_the_clients_tools_and_messages_byte_for_byte() {
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Body(PREFILLED.into()));
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&prefill], &[&decode]).await;
    let (status, _) = post_raw(&router.url, "/v1/chat/completions", AGENT_BODY).await;
    assert_eq!(status, 200);
    let member = |name: &str| {
        let start = AGENT_BODY.find(&format!("\"{name}\":")).unwrap();
        let end = AGENT_BODY[start..].find("}]").unwrap() + start + 2;
        AGENT_BODY[start..end].to_string()
    };
    let (tools, messages) = (member("tools"), member("messages"));
    for upstream in [&prefill, &decode] {
        let [leg] = upstream.received().try_into().unwrap();
        let sent = String::from_utf8(leg.body.to_vec()).unwrap();
        assert!(sent.contains(&tools), "{sent}");
        assert!(sent.contains(&messages), "{sent}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_parameters_to_pass_the_decode_leg_streams_the_clients_body_as_it_came() {
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Body(
        r#"{"id":"x","kv_transfer_params":null}"#.into(),
    ));
    let decode = TestUpstream::start("d").await;
    decode.set_reply(UpstreamReply::Trickle {
        chunks: 3,
        every: std::time::Duration::from_millis(5),
    });
    let router = fleet(&[&prefill], &[&decode]).await;
    let body = serde_json::to_vec(&conversation(true)).unwrap();
    let response = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(
        text.contains("[DONE]") || text.matches("data:").count() >= 3,
        "{text}"
    );
    assert_eq!(prefill.count(), 1);
    let [leg] = decode.received().try_into().unwrap();
    assert_eq!(leg.body, body, "byte for byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prefill_answers_the_client_and_no_decode_runs() {
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Status(400));
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&prefill], &[&decode]).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&conversation(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!((prefill.count(), decode.count()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_is_tried_on_another_prefill_instance() {
    let (broken, working) = (
        TestUpstream::start("p1").await,
        TestUpstream::start("p2").await,
    );
    broken.set_reply(UpstreamReply::Hangup);
    working.set_reply(UpstreamReply::Body(PREFILLED.into()));
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&broken, &working], &[&decode]).await;
    // New conversations until one is placed on the instance that hangs up.
    let mut sent = 0;
    while broken.count() == 0 && sent < 16 {
        let mut request = conversation(false);
        request["messages"][1]["content"] = json!(format!("task {sent}: fix the failing test"));
        let (status, answer) = post(&router.url, "/v1/chat/completions", &request).await;
        assert_eq!((status, answer["backend"].as_str()), (200, Some("d")));
        sent += 1;
    }
    assert_eq!(broken.count(), 1, "one prefill leg failed");
    assert_eq!(
        (working.count(), decode.count()),
        (sent, sent),
        "and each was tried again"
    );
    for leg in decode.received() {
        assert_eq!(
            body_of(&leg)["kv_transfer_params"]["remote_engine_id"],
            "e1"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_are_not_disaggregated_go_whole_to_a_decode_instance() {
    let prefill = TestUpstream::start("p").await;
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&prefill], &[&decode]).await;
    let mut several = conversation(false);
    several["n"] = json!(2);
    for (path, body) in [
        ("/v1/chat/completions", several),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": "embed this"}),
        ),
    ] {
        let (status, answer) = post(&router.url, path, &body).await;
        assert_eq!(
            (status, answer["backend"].as_str()),
            (200, Some("d")),
            "{path}"
        );
    }
    assert_eq!(prefill.count(), 0);
    assert_eq!(body_of(&decode.received()[0])["n"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_adds_a_prefill_instance_and_workers_shows_each_role() {
    let (decode, prefill) = (
        TestUpstream::start("d").await,
        TestUpstream::start("p").await,
    );
    prefill.set_reply(UpstreamReply::Body(PREFILLED.into()));
    let router = fleet(&[], &[&decode]).await;
    let admin = |path: String| client().post(format!("{}{path}", router.admin_url)).send();
    // A fleet of decode instances alone sends requests whole.
    let (status, _) = post(&router.url, "/v1/chat/completions", &conversation(false)).await;
    assert_eq!((status, decode.count()), (200, 1));
    assert!(
        body_of(&decode.received()[0])
            .get("kv_transfer_params")
            .is_none()
    );
    let added = admin(format!("/add_worker?url={}&role=prefill", prefill.url()));
    assert_eq!(added.await.unwrap().status(), 200);
    let unknown = admin(format!("/add_worker?url={}&role=both-ways", prefill.url()));
    assert_eq!(unknown.await.unwrap().status(), 400);
    router
        .wait_until("p is ready", |r| r.ready_backends() == 2)
        .await;
    let workers: Value = reqwest::get(format!("{}/workers", router.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let roles: Vec<&str> = (workers["workers"].as_array().unwrap().iter())
        .map(|w| w["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["decode", "prefill"]);
    let mut another = conversation(false);
    another["messages"][1]["content"] = json!("Another task: update the changelog.");
    let (status, answer) = post(&router.url, "/v1/chat/completions", &another).await;
    assert_eq!((status, answer["backend"].as_str()), (200, Some("d")));
    assert_eq!(prefill.count(), 1);
    let handed = body_of(&decode.received()[1]);
    assert_eq!(
        handed["kv_transfer_params"]["remote_block_ids"],
        json!([7, 8])
    );
}

async fn sim() -> prefix_router_sim::SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = prefix_router_sim::SimConfig {
        time_scale: 1000.0,
        ..prefix_router_sim::SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_instances_split_a_long_first_turn_and_decode_the_next_where_it_is() {
    let (prefill, decode) = (sim().await, sim().await);
    let url = |s: &prefix_router_sim::SimHandle| format!("http://{}", s.addr);
    let settings = prefix_router::config::Settings {
        prefill: Some(vec![url(&prefill)]),
        decode: Some(vec![url(&decode)]),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 2);
    let mut request = conversation(false);
    request["max_tokens"] = json!(8);
    let listing = "a file of the repository, read in full; ".repeat(200);
    request["messages"][1]["content"] = json!(format!("Fix the failing test. {listing}"));
    let (status, explained) = post(&router.admin_url, "/route", &request).await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["disaggregation"], "split", "{explained}");
    assert_eq!(explained["backend"].as_str(), Some(url(&prefill).as_str()));
    let (status, first) = post(&router.url, "/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{first}");
    let (prompt, cached) = usage_of(&first);
    assert!(
        prompt > 1000,
        "{prompt} tokens: longer than max_local_prefill_length"
    );
    assert_eq!(first["usage"]["completion_tokens"], 8, "decoded in full");
    assert_eq!(
        cached,
        (prompt - 1) / 16 * 16,
        "every full block loaded, none computed"
    );
    assert_eq!(
        (prefill.stats().requests, prefill.stats().generation_tokens),
        (1, 1)
    );
    // The next turn lacks a few tokens on the decode instance: no prefill leg.
    let answer = first["choices"][0]["message"]["content"].clone();
    request["messages"] = json!([request["messages"][0], request["messages"][1],
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Now run the whole test suite and report."}]);
    let (_, explained) = post(&router.admin_url, "/route", &request).await;
    assert_eq!(explained["disaggregation"], "local", "{explained}");
    assert_eq!(explained["backend"].as_str(), Some(url(&decode).as_str()));
    let (status, second) = post(&router.url, "/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{second}");
    let (next, cached) = usage_of(&second);
    assert_eq!((prefill.stats().requests, decode.stats().requests), (1, 2));
    assert!(
        cached >= prompt / 16 * 16 - 16,
        "found where it decoded: {cached} of {next}"
    );
    let metrics = router.metrics().await;
    let way = |way| {
        sum(
            &metrics,
            "prefix_router_disaggregated_total",
            &[("way", way)],
        )
    };
    assert_eq!((way("split"), way("local")), (1.0, 1.0));
}

fn usage_of(answer: &Value) -> (u64, u64) {
    let usage = &answer["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (usage["prompt_tokens"].as_u64().unwrap(), cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_during_the_prefill_leg_stops_it_and_no_decode_runs() {
    let prefill = TestUpstream::start("p").await;
    prefill.set_reply(UpstreamReply::Silent);
    let decode = TestUpstream::start("d").await;
    let router = fleet(&[&prefill], &[&decode]).await;
    let sent = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&conversation(false))
        .timeout(std::time::Duration::from_millis(500))
        .send()
        .await;
    assert!(sent.is_err(), "the client gave up waiting");
    assert_eq!(prefill.count(), 1);
    router
        .wait_until("the prefill leg stopped", |r| r.inflight() == 0)
        .await;
    assert_eq!(decode.count(), 0);
}
