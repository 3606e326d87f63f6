//! The router in front of a real vLLM: vLLM 0.32's CPU build serving a tiny random-weight
//! Qwen3 (`tests/vllm/setup.sh`, run by `make test-deps`), with 32-token blocks as on a
//! CPU, its prefix cache, its `cached_tokens` and its KV events. The router runs in token
//! mode on the model's own tokenizer directory and follows the engine's KV events. Fails
//! (never skips) when vLLM does not start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestRouter, free_loopback_addr, heavy, scratch_dir, settings};

/// Tokens per KV block (a multiple of 32 on the CPU).
const BLOCK: usize = 32;
/// Longest prompt plus output vLLM accepts.
const MAX_MODEL_LEN: usize = 2048;
/// KV blocks: `MAX_MODEL_LEN` and a block, twice.
const BLOCKS: usize = 2 * (MAX_MODEL_LEN / BLOCK + 1);
/// Sequences vLLM runs at once.
const SEQUENCES: usize = 4;
/// The longest vLLM may take to start on a loaded 2-core machine (about 50 s idle).
const START: Duration = Duration::from_secs(420);

/// One `vllm serve`, stopped (its whole process group) when dropped.
struct Vllm {
    child: Child,
    url: String,
    events: u16,
    log: PathBuf,
}

fn free_port() -> u16 {
    let addr = free_loopback_addr().unwrap();
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

impl Vllm {
    /// Starts vLLM on free ports and waits for its `/health`.
    async fn start() -> Vllm {
        let mut vllm = Vllm::spawn(&[]);
        vllm.wait_healthy().await;
        vllm
    }

    /// Starts vLLM on free ports with `extra` flags, without waiting for it.
    fn spawn(extra: &[&str]) -> Vllm {
        let (vllm, model) = crate::support::fixtures::vllm();
        let (port, events) = (free_port(), free_port());
        let dir = scratch_dir("vllm");
        let log = dir.join("vllm.log");
        let mut command = Command::new(vllm);
        command.arg("serve").arg(&model);
        command.args(["--served-model-name", "tiny", "--host", "127.0.0.1"]);
        command.args(["--port", &port.to_string()]);
        command.args(["--dtype", "bfloat16", "--enforce-eager"]);
        command.args(["--block-size", &BLOCK.to_string()]);
        command.args(["--enable-prefix-caching", "--enable-prompt-tokens-details"]);
        command.args(["--max-model-len", &MAX_MODEL_LEN.to_string()]);
        command.args(["--max-num-seqs", &SEQUENCES.to_string()]);
        // Requests of equal priority (the default 0) are served first come, first served.
        command.args(["--scheduling-policy", "priority"]);
        // Tools in a request (as Claude Code sends them) need a tool-call parser.
        command.args(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
        command.args(["--num-gpu-blocks-override", &BLOCKS.to_string()]);
        let bytes = BLOCKS * BLOCK * 512; // the model's KV: 512 bytes a token
        command.args(["--kv-cache-memory-bytes", &bytes.to_string()]);
        let config = json!({"enable_kv_cache_events": true, "publisher": "zmq",
                            "endpoint": format!("tcp://*:{events}")});
        command.args(["--kv-events-config", &config.to_string()]);
        command.args(extra);
        environment(&mut command, &dir);
        command.stdout(Stdio::from(std::fs::File::create(&log).unwrap()));
        command.stderr(Stdio::from(
            std::fs::File::options().append(true).open(&log).unwrap(),
        ));
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("vllm serve");
        Vllm {
            child,
            url: format!("http://127.0.0.1:{port}"),
            events,
            log,
        }
    }

    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START;
        let client = reqwest::Client::new();
        loop {
            let health = client.get(format!("{}/health", self.url)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "vLLM exited ({status}) before it was healthy:\n{}",
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "vLLM not healthy after {START:?}:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The end of its log.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// One core, and every file vLLM writes in `dir`.
fn environment(command: &mut Command, dir: &Path) {
    for sub in ["cache", "tmp", "rpc", "inductor"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    command.env("VLLM_CPU_OMP_THREADS_BIND", "0");
    // NixlConnector's side channel, on loopback and a port of each instance's own.
    command.env("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1");
    command.env("VLLM_NIXL_SIDE_CHANNEL_PORT", free_port().to_string());
    command.env("VLLM_CACHE_ROOT", dir.join("cache"));
    command.env("TMPDIR", dir.join("tmp"));
    command.env("VLLM_RPC_BASE_PATH", dir.join("rpc"));
    command.env("TORCHINDUCTOR_CACHE_DIR", dir.join("inductor"));
    command.env("HF_HUB_OFFLINE", "1");
    command.env("VLLM_NO_USAGE_STATS", "1");
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

fn chat(messages: &[Value], max_tokens: usize) -> Value {
    json!({"model": "tiny", "max_tokens": max_tokens, "messages": messages})
}

async fn post(url: &str, body: &Value) -> (u16, Value) {
    post_raw(url, body.to_string()).await
}

/// Posts `body` as it is written (its keys in their order).
async fn post_raw(url: &str, body: String) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_behind_the_router_in_token_mode_with_its_kv_events() {
    // Its start-up takes both cores for most of a minute: not beside the timed tests.
    let _heavy = heavy().await;
    let vllm = Vllm::start().await;
    let (_, model) = crate::support::fixtures::vllm();
    let mut s = settings(&[]);
    s.worker_urls = Some(vec![vllm.url.clone()]);
    s.tokenizer = Some(model);
    s.kv_events = Some(format!("tcp://{{host}}:{}", vllm.events));
    let router = TestRouter::start(s, 1);
    let completions = format!("{}/v1/chat/completions", router.url);

    // A first turn; the engine's KV events then show its blocks.
    let system = "You review Rust code for a storage engine. ".repeat(40);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "What does this function do?"}),
    ];
    let (status, first) = post(&completions, &chat(&messages, 4)).await;
    assert_eq!(status, 200, "{first}");
    messages.push(json!({"role": "assistant", "content": "It flushes the log."}));
    messages.push(json!({"role": "user", "content": "And when does it fail?"}));
    let second = chat(&messages, 4);
    let route = format!("{}/route", router.admin_url);
    let wait = Instant::now() + Duration::from_secs(20);
    let explained = loop {
        let (status, explained) = post(&route, &second).await;
        assert_eq!(status, 200, "{explained}");
        let record = &explained["backends"][0]["record"];
        if record["mode"] == "exact" && record["gpu_tokens"].as_u64() > Some(0) {
            break explained;
        }
        let late = Instant::now() > wait;
        assert!(!late, "no record of the blocks: {explained}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(explained["mode"], "tokens", "{explained}");
    // What the engine's record holds of the second turn, and what the router's own index
    // predicts, in whole blocks of the engine's size (read from `vllm:cache_config_info`).
    let recorded = explained["matched_tokens"].as_u64().unwrap();
    let predicted = explained["backends"][0]["matched_tokens"].as_u64().unwrap();

    // The second turn is served from vLLM's prefix cache: exactly as recorded and predicted,
    // and the router counted its prompt as vLLM did.
    let (status, answer) = post(&completions, &second).await;
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached > Some(0), "{usage}");
    assert_eq!(
        (Some(recorded), Some(predicted)),
        (cached, cached),
        "{explained} {usage}"
    );
    let prompt = usage["prompt_tokens"].as_u64();
    assert_eq!(
        explained["prompt_tokens"].as_u64(),
        prompt,
        "{explained} {usage}"
    );

    // A prompt over max-model-len gets vLLM's own 400 through the router, and holds no
    // KV: the conversation it opened is not counted live.
    let live = |explained: &Value| explained["backends"][0]["live_conversations"].as_u64();
    let (_, explained) = post(&route, &second).await;
    assert_eq!(live(&explained), Some(1), "{explained}");
    let long = "Every word here is a token or two of a prompt too long. ".repeat(400);
    let too_long = chat(&[json!({"role": "user", "content": long})], 4);
    let (status, refused) = post(&completions, &too_long).await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("maximum context length"), "{refused}");
    let (_, explained) = post(&route, &second).await;
    assert_eq!(live(&explained), Some(1), "{explained}");
    messages_in_token_mode(&router).await;
    drop(router);
    high_before_the_low_it_queued(&vllm).await;
    drop(vllm);
}

/// A gauge of vLLM's `/metrics`.
async fn gauge(vllm: &Vllm, name: &str) -> u64 {
    let page = reqwest::get(format!("{}/metrics", vllm.url)).await.unwrap();
    let page = page.text().await.unwrap();
    let line = page
        .lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'));
    let value = line.and_then(|l| l.rsplit(' ').next()).unwrap_or("0");
    value.parse::<f64>().unwrap() as u64
}

/// Waits until vLLM runs `running` requests and queues `waiting`.
async fn until_engine(vllm: &Vllm, running: u64, waiting: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = (
            gauge(vllm, "vllm:num_requests_running").await,
            gauge(vllm, "vllm:num_requests_waiting").await,
        );
        if now == (running, waiting) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "vLLM at {now:?}, not {:?}",
            (running, waiting)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Behind a router with a tenants file, vLLM scheduling by priority admits a `high`
/// request before a `low` one it queued first, by the `X-Vllm-Priority` the router sets
/// (with `engine_priority = false` it runs the `low` one first: checked by hand).
async fn high_before_the_low_it_queued(vllm: &Vllm) {
    let file = format!(
        "[tenants.p]\nkeys = [\"{}\"]\nmax_priority = \"high\"\n",
        crate::support::sha256_entry("sk-priority")
    );
    let mut s = settings(&[]);
    s.worker_urls = Some(vec![vllm.url.clone()]);
    // The router learns no hold here: the engine's own queue decides.
    s.metrics_interval = Some(600.0);
    s.tenants_file = Some(crate::tenants::tenants_file("vllm-priority", &file));
    let router = TestRouter::start(s, 1);
    let send = |priority: &'static str, tokens: usize| {
        let url = format!("{}/v1/chat/completions", router.url);
        let mut body = chat(
            &[json!({"role": "user", "content": format!("A {priority} one.")})],
            tokens,
        );
        body["ignore_eos"] = json!(true);
        async move {
            let response = (reqwest::Client::new().post(url))
                .header("x-priority", priority)
                .bearer_auth("sk-priority")
                .json(&body)
                .timeout(Duration::from_secs(120))
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), priority)
        }
    };
    // The running requests end a second apart (decode is about 10 ms a token), so one
    // slot frees at a time: vLLM admits `high` into the first and `low` into the next.
    let running: Vec<_> = (0..SEQUENCES)
        .map(|i| tokio::spawn(send("low", 300 + 100 * i)))
        .collect();
    until_engine(vllm, SEQUENCES as u64, 0).await;
    let mut queued = tokio::task::JoinSet::new();
    queued.spawn(send("low", 4));
    until_engine(vllm, SEQUENCES as u64, 1).await;
    queued.spawn(send("high", 4));
    until_engine(vllm, SEQUENCES as u64, 2).await;
    let first = queued.join_next().await.unwrap().unwrap();
    assert_eq!(first, (200, "high"), "vLLM ran high first");
    assert_eq!(queued.join_next().await.unwrap().unwrap(), (200, "low"));
    for request in running {
        assert_eq!(request.await.unwrap().0, 200);
    }
}

/// A Claude Code-shaped Messages request (the attribution line, an inline system message,
/// tools, a tool call and its result): the router's token count in token mode is vLLM's,
/// for `/v1/messages` and for `count_tokens`.
async fn messages_in_token_mode(router: &TestRouter) {
    let body = json!({"model": "tiny", "max_tokens": 4,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=0a1b2;"},
                   {"type": "text", "text": "You are a coding agent. Keep changes small. "}],
        "tools": [{"name": "Bash", "description": "Runs a shell command",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                    "required": ["command"]}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Why does the build fail?"}]},
            {"role": "system", "content": "Today is 2026-12-06."},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cargo build"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "error[E0425]: x"},
                {"type": "text", "text": "Fix it."}]}]});
    let route = format!("{}/route?path=/v1/messages", router.admin_url);
    let (status, explained) = post(&route, &body).await;
    assert_eq!(
        (status, &explained["mode"]),
        (200, &json!("tokens")),
        "{explained}"
    );
    let (status, answer) = post(&format!("{}/v1/messages", router.url), &body).await;
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    let part = |key: &str| usage[key].as_u64().unwrap_or(0);
    let prompt = part("input_tokens")
        + part("cache_read_input_tokens")
        + part("cache_creation_input_tokens");
    assert_eq!(
        explained["prompt_tokens"].as_u64(),
        Some(prompt),
        "{explained} {usage}"
    );
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let url = format!("{}/v1/messages/count_tokens", router.url);
    let (status, counted) = post(&url, &count).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["input_tokens"].as_u64(), Some(prompt), "{counted}");
}

/// vLLM's `ExampleConnector` over a folder both instances share: each saves the KV of the
/// prompts it computes there, and loads what a request's prompt finds there.
fn shared_storage(dir: &Path) -> String {
    json!({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"shared_storage_path": dir}})
    .to_string()
}

/// A prefill instance and a decode instance with these `--kv-transfer-config`s, the prompt
/// computed in one step (the example connector is wrong on a chunked one), healthy.
async fn pair(prefill: &str, decode: &str) -> (Vllm, Vllm) {
    let flags = |config| {
        [
            "--kv-transfer-config",
            config,
            "--max-num-batched-tokens",
            "2048",
        ]
    };
    let (mut p, mut d) = (Vllm::spawn(&flags(prefill)), Vllm::spawn(&flags(decode)));
    p.wait_healthy().await;
    d.wait_healthy().await;
    (p, d)
}

/// The router in token mode in front of the pair, every request in two legs.
fn pd_router(prefill: &Vllm, decode: &Vllm) -> TestRouter {
    let (_, model) = crate::support::fixtures::vllm();
    let mut s = settings(&[]);
    s.prefill = Some(vec![prefill.url.clone()]);
    s.decode = Some(vec![decode.url.clone()]);
    s.tokenizer = Some(model);
    s.max_local_prefill_length = Some(0);
    TestRouter::start(s, 2)
}

/// A chat body as an agent writes it: a tool schema whose keys are out of sorted order (the
/// template renders them in that order, so both legs must keep it for their prompts to
/// match), and a prompt whose length is not 1 more than whole blocks (the example
/// connector stores nothing for those).
async fn agent_body(router: &TestRouter) -> String {
    let tools = r#"[{"type":"function","function":{"name":"read_file","description":"Read a file",
        "parameters":{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},
        "required":["path"]}}}]"#;
    let system = "You review Rust code for a storage engine. ".repeat(30);
    let mut question = "What does this function do?".to_string();
    loop {
        let messages = json!([{"role": "system", "content": system},
                              {"role": "user", "content": question}]);
        let body = format!(
            r#"{{"model":"tiny","max_tokens":8,"temperature":0,"tools":{tools},"messages":{messages}}}"#
        );
        let route = format!("{}/route", router.admin_url);
        let (status, explained) = post_raw(&route, body.clone()).await;
        assert_eq!(status, 200, "{explained}");
        let tokens = explained["prompt_tokens"].as_u64().unwrap() as usize;
        if tokens % BLOCK != 1 {
            return body;
        }
        question.push_str(" Briefly.");
    }
}

/// Sends `body` through the pair's router: one token prefilled, `moved` (a counter of the
/// decode instance) grown by the handoff, and the answer the prefill instance alone gives.
async fn split_answers_as_one(
    router: &TestRouter,
    (prefill, decode): (&Vllm, &Vllm),
    body: String,
    moved: &str,
) {
    assert_eq!(gauge(decode, moved).await, 0);
    let (status, split) =
        post_raw(&format!("{}/v1/chat/completions", router.url), body.clone()).await;
    assert_eq!(status, 200, "{split}");
    assert!(
        gauge(decode, moved).await > 0,
        "the decode instance took the prefill's KV ({moved})"
    );
    assert_eq!(
        gauge(prefill, "vllm:generation_tokens_total").await,
        1,
        "one token prefilled"
    );
    // The same request on one instance alone answers the same, greedily.
    let (status, alone) = post_raw(&format!("{}/v1/chat/completions", prefill.url), body).await;
    assert_eq!(status, 200, "{alone}");
    let text = |answer: &Value| answer["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&split), text(&alone));
    assert_eq!(split["usage"]["completion_tokens"], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_pair_prefills_on_one_and_decodes_on_the_other() {
    let _heavy = heavy().await;
    let store = scratch_dir("vllm-pd-store");
    let config = shared_storage(&store);
    let (prefill, decode) = pair(&config, &config).await;
    let router = pd_router(&prefill, &decode);
    let body = agent_body(&router).await;
    let loaded = "vllm:external_prefix_cache_hits_total";
    split_answers_as_one(&router, (&prefill, &decode), body, loaded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_pair_hands_off_over_nixl() {
    let _heavy = heavy().await;
    let config = |role| {
        json!({"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"})
            .to_string()
    };
    let (prefill, decode) = pair(&config("kv_producer"), &config("kv_consumer")).await;
    let router = pd_router(&prefill, &decode);
    let body = agent_body(&router).await;
    let pulled = "vllm:nixl_xfer_time_seconds_count";
    split_answers_as_one(&router, (&prefill, &decode), body, pulled).await;
}
