//! Many models behind one router: each backend's `/v1/models` (simulated vLLM instances
//! serving two names; test backends listing a LoRA adapter) says where a request may go;
//! an unknown model gets 404 `model_not_found` and reaches nothing, unless the fleet serves
//! one model, which takes any name; a model whose backends are down gets 503, never the
//! other model's backends; `/v1/models` on the router lists the union; the same text on
//! two models never shares a prefix match.

use prefix_router::config::Settings;
use prefix_router_sim::{SimConfig, SimHandle};
use serde_json::{Value, json};

use crate::support::*;

async fn sim(model: &str) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = SimConfig {
        time_scale: 1000.0,
        model: model.into(),
        name: model.into(),
        ..SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

/// Test settings that also read models often, and take three failed checks to put a
/// backend out: these tests count where requests went.
fn steady() -> Settings {
    Settings {
        metrics_interval: Some(0.1),
        health_check_failures: Some(3),
        ..settings(&[])
    }
}

/// A router in front of `urls`, once it listed `models` on its own `/v1/models`.
async fn router_listing(urls: Vec<String>, models: &[&str]) -> TestRouter {
    let n = urls.len();
    let settings = Settings {
        worker_urls: Some(urls),
        ..steady()
    };
    let router = TestRouter::start(settings, n);
    let listed = |r: &TestRouter| {
        let ready = r.state().fleet.ready(&[]);
        let names: Vec<String> = ready.models().into_iter().map(|m| m.id).collect();
        models.iter().all(|m| names.iter().any(|n| n == m))
    };
    router
        .wait_until("the backends' models are read", listed)
        .await;
    router
}

/// A chat request to the router at `url`: its status and body.
async fn chat_to(url: &str, body: &Value) -> (u16, Value) {
    post(url, "/v1/chat/completions", body).await
}

/// The router's metrics once they count `n` answered requests by model: an exchange is
/// counted when it ends, which may be just after its client read the last byte.
async fn counted(router: &TestRouter, n: u64) -> prometheus_parse::Scrape {
    for _ in 0..100 {
        let scrape = router.metrics().await;
        let ok = [("status", "200")];
        if sum(&scrape, "prefix_router_model_requests_total", &ok) >= n as f64 {
            return scrape;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    router.metrics().await
}

/// The router's own `GET /v1/models` answer.
async fn listed(router: &TestRouter) -> Value {
    let response = client()
        .get(format!("{}/v1/models", router.url))
        .send()
        .await;
    response.unwrap().json().await.unwrap()
}

fn ask(model: &str, conversation: usize) -> Value {
    let system = format!("conversation {conversation}: answer about compilers. ").repeat(20);
    json!({"model": model, "max_tokens": 4, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "why?"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_reaches_only_its_backends_and_unknown_ones_get_404() {
    let sims = [sim("big").await, sim("big").await, sim("small").await];
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let router = router_listing(urls, &["big", "small"]).await;
    for conversation in 0..6 {
        assert_eq!(
            chat_to(&router.url, &ask("small", conversation)).await.0,
            200
        );
        assert_eq!(chat_to(&router.url, &ask("big", conversation)).await.0, 200);
    }
    let requests: Vec<u64> = sims.iter().map(|s| s.stats().requests).collect();
    assert_eq!(requests[2], 6, "every small request on the small backend");
    assert_eq!(
        requests[0] + requests[1],
        6,
        "every big one on the big ones"
    );
    let (status, body) = chat_to(&router.url, &ask("medium", 0)).await;
    assert_eq!(status, 404);
    assert_error(&body, "model_not_found");
    let (status, body) = chat_to(&router.url, &ask(&"x".repeat(1 << 20), 0)).await;
    assert_eq!(status, 404);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.len() < 400, "a 1 MiB name is not echoed whole");
    let mut no_model = ask("big", 0);
    no_model.as_object_mut().unwrap().remove("model");
    let (status, body) = chat_to(&router.url, &no_model).await;
    assert_eq!(status, 400);
    assert_error(&body, "model_required");
    let total: u64 = sims.iter().map(|s| s.stats().requests).sum();
    assert_eq!(total, 12, "neither reached a backend");
    let scrape = counted(&router, 12).await;
    for model in ["big", "small"] {
        let labels = [("model", model), ("status", "200")];
        assert_eq!(
            sum(&scrape, "prefix_router_model_requests_total", &labels),
            6.0
        );
        let prompt = sum(
            &scrape,
            "prefix_router_model_prompt_tokens_total",
            &[("model", model)],
        );
        assert!(prompt > 0.0, "{model}: the backends' usage, by model");
    }
    let listed = listed(&router).await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["big", "small"]);
    assert_eq!(listed["object"], "list");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_goes_to_the_backends_that_loaded_it() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
        TestUpstream::start("c").await,
    ];
    ups[0].set_models(&[("base", None), ("sql-lora", Some("base"))]);
    ups[1].set_models(&[("base", None), ("sql-lora", Some("base"))]);
    ups[2].set_models(&[("base", None)]);
    let urls = ups.iter().map(|u| u.url()).collect();
    let router = router_listing(urls, &["base", "sql-lora"]).await;
    for conversation in 0..8 {
        assert_eq!(
            chat_to(&router.url, &ask("sql-lora", conversation)).await.0,
            200
        );
    }
    assert_eq!(ups[0].count() + ups[1].count(), 8);
    assert_eq!(ups[2].count(), 0, "c has no sql-lora");
    // The base model still goes anywhere; no model is fine with one base model.
    let mut no_model = ask("base", 99);
    no_model.as_object_mut().unwrap().remove("model");
    assert_eq!(chat_to(&router.url, &no_model).await.0, 200);
    let listed = listed(&router).await;
    assert_eq!(listed["data"][1]["id"], "sql-lora");
    assert_eq!(listed["data"][1]["parent"], "base");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_model_fleet_takes_any_name_and_an_empty_list_limits_nothing() {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    ups.iter().for_each(|u| u.set_models(&[("mock", None)]));
    let router = router_listing(ups.iter().map(|u| u.url()).collect(), &["mock"]).await;
    for (conversation, name) in ["test-model", "gpt-4o", "mock", ""].iter().enumerate() {
        let (status, body) = chat_to(&router.url, &ask(name, conversation)).await;
        assert_eq!(status, 200, "{name}: {body}");
    }
    let models: Vec<Value> = (ups.iter().flat_map(|u| u.received()))
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["model"].clone())
        .collect();
    assert_eq!(models.len(), 4, "each reached a backend, its name as sent");
    assert!(models.contains(&json!("test-model")) && models.contains(&json!("gpt-4o")));
    // A retry after a 5xx goes on to the other backend under any name too.
    ups[0].set_reply(UpstreamReply::Status(500));
    let chats = |u: &TestUpstream| {
        let all = u.received().into_iter();
        all.filter(|r| r.path == "/v1/chat/completions").count()
    };
    let failing = chats(&ups[0]);
    for conversation in 10..14 {
        let (status, body) = chat_to(&router.url, &ask("test-model", conversation)).await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(chats(&ups[0]) > failing, "some were retried");
    let empty = TestUpstream::start("empty").await;
    empty.set_models(&[]);
    let router = TestRouter::start(
        Settings {
            worker_urls: Some(vec![empty.url()]),
            ..steady()
        },
        1,
    );
    let read = |r: &TestRouter| {
        r.state()
            .fleet
            .ready(&[])
            .backend(0)
            .is_some_and(|b| b.models.served().is_some())
    };
    router.wait_until("the empty list is read", read).await;
    assert_eq!(chat_to(&router.url, &ask("anything", 0)).await.0, 200);
    let chats = empty
        .received()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions");
    assert_eq!(chats.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_text_on_two_models_shares_no_prefix() {
    let sims = [sim("big").await, sim("small").await];
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let router = router_listing(urls.clone(), &["big", "small"]).await;
    assert_eq!(chat_to(&router.url, &ask("big", 1)).await.0, 200);
    let explain = |model: &str| {
        let body = ask(model, 1);
        let url = format!("{}/route", router.admin_url);
        async move {
            let response = client().post(url).json(&body).send().await.unwrap();
            response.json::<Value>().await.unwrap()
        }
    };
    let big = explain("big").await;
    assert!(big["matched_tokens"].as_u64().unwrap() > 0, "{big}");
    let small = explain("small").await;
    assert_eq!(small["matched_tokens"], 0, "{small}");
    assert_eq!(small["model"], "small");
    assert_eq!(small["backend"], urls[1].as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pools_route_backends_that_list_nothing() {
    use prefix_router::config::ModelPool;
    let ups = [
        TestUpstream::start("big").await,
        TestUpstream::start("small").await,
    ];
    let pool = |name: &str, up: &TestUpstream, aliases: &[&str]| ModelPool {
        name: name.into(),
        worker_urls: vec![up.url()],
        aliases: aliases.iter().map(|a| a.to_string()).collect(),
    };
    let settings = Settings {
        models: Some(vec![
            pool("big", &ups[0], &[]),
            pool("small", &ups[1], &["s"]),
        ]),
        ..steady()
    };
    let router = TestRouter::start(settings, 2);
    for conversation in 0..3 {
        assert_eq!(chat_to(&router.url, &ask("big", conversation)).await.0, 200);
        assert_eq!(chat_to(&router.url, &ask("s", conversation)).await.0, 200);
    }
    assert_eq!(ups.each_ref().map(|u| u.count()), [3, 3]);
    let (status, body) = chat_to(&router.url, &ask("medium", 0)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("model_not_found"))
    );
    let listed = listed(&router).await;
    let ids: Vec<&str> = (listed["data"].as_array().unwrap().iter())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["big", "s", "small"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_backends_are_down_gets_503_and_never_the_other_models_backends() {
    let ups = [
        TestUpstream::start("big").await,
        TestUpstream::start("small").await,
    ];
    ups[0].set_models(&[("big", None)]);
    ups[1].set_models(&[("small", None)]);
    let router = router_listing(ups.iter().map(|u| u.url()).collect(), &["big", "small"]).await;
    ups[0].set_healthy(false);
    router
        .wait_until("big is down", |r| r.ready_backends() == 1)
        .await;
    let (status, body) = chat_to(&router.url, &ask("big", 0)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        ups.each_ref().map(|u| u.count()),
        [0, 0],
        "big reached nothing"
    );
    assert_eq!(chat_to(&router.url, &ask("small", 0)).await.0, 200);
    let (status, body) = chat_to(&router.url, &ask("medium", 0)).await;
    assert_eq!(status, 404);
    assert_error(&body, "model_not_found");
    let mut no_model = ask("small", 0);
    no_model.as_object_mut().unwrap().remove("model");
    let (status, body) = chat_to(&router.url, &no_model).await;
    assert_eq!(status, 400, "the fleet still serves two models");
    assert_error(&body, "model_required");
    assert_eq!(ups.each_ref().map(|u| u.count()), [0, 1]);
    ups[0].set_healthy(true);
    router
        .wait_until("big is back", |r| r.ready_backends() == 2)
        .await;
    assert_eq!(chat_to(&router.url, &ask("big", 0)).await.0, 200);
    assert_eq!(ups.each_ref().map(|u| u.count()), [1, 1]);
}
