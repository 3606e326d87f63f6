//! Token mode with a real model's tokenizer (Qwen3's, fetched by `tests/tokens/fetch.sh`),
//! and `POST /route`, which explains a routing without sending or remembering anything.

use std::path::PathBuf;

use prefix_router::config::Settings;
use prefix_router_core::request::Endpoint;
use prefix_router_sim::SimConfig;
use prefix_router_sim::hf::HfModel;
use prefix_router_tokens::Model;
use serde_json::{Value, json};

use crate::support::*;

/// Qwen3's tokenizer directory, fetched by `make test-deps`.
fn qwen3() -> PathBuf {
    fixtures::tokenizer("qwen3")
}

/// Qwen3's tokenizer with a chat template that raises an exception on tool messages.
fn raising_template() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers-test/raising");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(qwen3().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let template = "{%- for m in messages %}{%- if m.role == 'tool' %}\
        {{ raise_exception('tool messages are not supported') }}{%- endif %}\
        <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}";
    let config = json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn turn(n: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are terse. ".repeat(60)})];
    for t in 0..n {
        let ask = format!("question {t}: {}", "why is the sky blue? ".repeat(40));
        messages.push(json!({"role": "user", "content": ask}));
        if t + 1 < n {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    json!({"model": "qwen3", "messages": messages, "max_tokens": 4})
}

/// The token ids the engine prefills for `body`.
fn ids(model: &Model, body: &Value) -> Vec<u32> {
    let bytes = serde_json::to_vec(body).unwrap();
    let prompt = model.renderer().prompt(Endpoint::Chat, &bytes).unwrap();
    model.ids(&prompt).unwrap()
}

async fn explain(router: &TestRouter, path: &str, body: &[u8]) -> (u16, Value) {
    let resp = client()
        .post(format!("{}/route?path={path}", router.admin_url))
        .header("x-session-id", "explained")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn token_settings(ups: &[&TestUpstream]) -> Settings {
    Settings {
        tokenizer: Some(qwen3()),
        ..settings(ups)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_routed_on_the_models_tokens_and_explained_exactly() {
    let model = Model::load(&qwen3()).unwrap();
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let router = TestRouter::start(token_settings(&[&ups[0], &ups[1]]), 2);
    let first = turn(1);
    let (status, reply) = post(&router.url, "/v1/chat/completions", &first).await;
    assert_eq!(status, 200, "{reply}");
    let home = reply["backend"].as_str().unwrap().to_string();
    // The client may read the answer before the router counted the request out.
    let idle = |r: &TestRouter| r.inflight() == 0;
    router.wait_until("the first request to end", idle).await;

    let second = serde_json::to_vec(&turn(2)).unwrap();
    let (status, why) = explain(&router, "/v1/chat/completions", &second).await;
    assert_eq!(status, 200, "{why}");
    let (a, b) = (ids(&model, &first), ids(&model, &turn(2)));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(why["mode"], "tokens");
    assert_eq!(why["estimated"], false);
    assert_eq!(why["prompt_tokens"], b.len());
    assert_eq!(why["matched_tokens"], common / 16 * 16, "{why}");
    assert_eq!(why["outcome"], "prefix_hit");
    let chosen = why["backend"].as_str().unwrap();
    assert_eq!(ups.iter().find(|u| u.url() == chosen).unwrap().name(), home);
    let backends = why["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 2);
    let other = backends.iter().find(|b| b["url"] != chosen).unwrap();
    assert_eq!(other["matched_tokens"], 0);

    // Explaining sent nothing and remembered nothing: the same answer again, and the
    // data plane then does what it said.
    assert_eq!(ups.iter().map(TestUpstream::count).sum::<usize>(), 1);
    assert_eq!(
        explain(&router, "/v1/chat/completions", &second).await.1,
        why
    );
    let (_, reply) = post(&router.url, "/v1/chat/completions", &turn(2)).await;
    assert_eq!(
        ups.iter().find(|u| u.url() == chosen).unwrap().name(),
        reply["backend"]
    );
    let received = ups.iter().flat_map(TestUpstream::received).last().unwrap();
    assert_eq!(received.body, second, "forwarded byte for byte");

    let scrape = router.metrics().await;
    let rendered = [("mode", "tokens"), ("reason", "rendered")];
    assert_eq!(sum(&scrape, "prefix_router_prompts_total", &rendered), 2.0);
    let reused = sum(
        &scrape,
        "prefix_router_prompt_tokens_total",
        &[("source", "reused")],
    );
    assert!(reused > 0.0, "the second turn reused the first's tokens");
    assert!(sum(&scrape, "prefix_router_token_cache_bytes", &[]) > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_template_refuses_is_routed_on_its_text_and_counted() {
    let ups = [TestUpstream::start("a").await];
    let settings = Settings {
        tokenizers: Some([("strict".to_string(), raising_template())].into()),
        ..settings(&[&ups[0]])
    };
    let router = TestRouter::start(settings, 1);
    let body = json!({"model": "strict", "messages": [
        {"role": "user", "content": "look it up"},
        {"role": "tool", "content": "found"},
    ]});
    let (status, reply) = post(&router.url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(ups[0].count(), 1);
    let (status, why) = explain(&router, "/v1/chat/completions", body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(why["mode"], "text");
    assert!(
        why["unrendered"].as_str().unwrap().contains("template"),
        "{why}"
    );
    let scrape = router.metrics().await;
    let text = [("mode", "text"), ("reason", "template")];
    assert_eq!(sum(&scrape, "prefix_router_prompts_total", &text), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_estimates_in_text_mode_and_refuses_bad_bodies_like_the_data_plane() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1]]), 2);
    let body = serde_json::to_vec(&turn(1)).unwrap();
    let (status, why) = explain(&router, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(
        (why["mode"].as_str(), why["estimated"].as_bool()),
        (Some("text"), Some(true))
    );
    assert_eq!(
        why["session"], "header:x-session-id",
        "the request's headers count"
    );
    assert!(why["prompt_tokens"].as_u64().unwrap() > 100);

    let (status, error) = explain(&router, "/v1/chat/completions", b"{\"messages\": 3}").await;
    assert_eq!(status, 400);
    assert_error(&error, "invalid_body");
    let (data_status, data_error) =
        post(&router.url, "/v1/chat/completions", &json!({"messages": 3})).await;
    assert_eq!((status, &error), (data_status, &data_error));
    let (status, error) = explain(&router, "/v1/models", &body).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/models")
    );
    assert_eq!(
        ups.iter().map(TestUpstream::count).sum::<usize>(),
        0,
        "nothing was sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_holds_the_tokens_the_router_predicted() {
    let model = std::sync::Arc::new(HfModel::load(&qwen3()).unwrap());
    let mut sims = Vec::new();
    for i in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = SimConfig {
            tokenizer: Some(model.clone()),
            time_scale: 1000.0,
            name: format!("sim-{i}"),
            model: "qwen3".into(),
            ..SimConfig::default()
        };
        sims.push(prefix_router_sim::start(config, listener).await.unwrap());
    }
    let urls = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let router_settings = Settings {
        worker_urls: Some(urls),
        tokenizer: Some(qwen3()),
        ..settings(&[])
    };
    let router = TestRouter::start(router_settings, 2);
    let (status, first) = post(&router.url, "/v1/chat/completions", &turn(1)).await;
    assert_eq!(status, 200, "{first}");
    let second = serde_json::to_vec(&turn(2)).unwrap();
    let (_, why) = explain(&router, "/v1/chat/completions", &second).await;
    assert_eq!(why["mode"], "tokens");
    let (status, reply) = post(&router.url, "/v1/chat/completions", &turn(2)).await;
    assert_eq!(status, 200, "{reply}");
    let usage = &reply["usage"];
    assert_eq!(usage["prompt_tokens"], why["prompt_tokens"], "{reply}");
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        why["matched_tokens"]
    );
    assert!(why["matched_tokens"].as_u64().unwrap() > 100);
}
