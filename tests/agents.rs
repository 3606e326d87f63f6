//! The coding agents' own CLIs through the router, offline, in front of 4 simulated vLLM
//! instances: Claude Code (Messages API), Codex (Responses API) and OpenCode (chat), each
//! two turns of one session. Turn 2 reaches turn 1's backend and is served from its cache.
//! The CLIs come from npm (`tests/agents/setup.sh`, run by `make test-deps`); a test fails
//! when its CLI is missing. How each is driven: `tests/agents/README.md`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use prefix_router::config::Settings;
use prefix_router_sim::{SimConfig, SimHandle};
use tokio::process::Command;

use crate::support::*;

/// The longest one turn of a CLI may take.
const TURN: Duration = Duration::from_secs(90);

async fn sim() -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // The agents continue an answer cut at their 32 000 tokens: the model ends its own.
    let config = SimConfig {
        time_scale: 1000.0,
        answer_tokens: Some(24),
        ..SimConfig::default()
    };
    prefix_router_sim::start(config, listener).await.unwrap()
}

/// The directory of the CLIs' commands.
fn bin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("target/agents/node_modules/.bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run tests/agents/setup.sh (make test-deps)",
        path.display()
    );
    path
}

/// A fresh home and working directory for one CLI's session.
fn home(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "prefix-router-agents-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("work")).unwrap();
    dir
}

/// Runs `command` in `home`'s working directory with a clean environment plus `env`;
/// panics with its output unless it exits 0 within [`TURN`].
async fn run(command: &Path, args: &[&str], home: &Path, env: &[(&str, String)]) {
    let mut cmd = Command::new(command);
    cmd.args(args)
        .current_dir(home.join("work"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("TERM", "dumb")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(TURN, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} took over {TURN:?}", command.display()))
        .unwrap();
    assert!(
        output.status.success(),
        "{} {args:?}: {}\nstdout: {}\nstderr: {}",
        command.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Each backend's (requests, prompt tokens, cached tokens).
fn stats(sims: &[SimHandle]) -> Vec<(u64, u64, u64)> {
    let one = |s: &SimHandle| {
        let s = s.stats();
        (s.requests, s.prompt_tokens, s.cached_tokens)
    };
    sims.iter().map(one).collect()
}

/// A router on its defaults in front of 4 simulated instances.
async fn fleet() -> ([SimHandle; 4], TestRouter) {
    let sims = [sim().await, sim().await, sim().await, sim().await];
    let settings = Settings {
        worker_urls: Some(sims.iter().map(|s| format!("http://{}", s.addr)).collect()),
        ..settings(&[])
    };
    let router = TestRouter::start(settings, 4);
    (sims, router)
}

/// Runs turn 1 then turn 2; checks that turn 2 was one request, on a backend turn 1
/// reached, and that that backend served at least 90% of what turn 1 sent it from its
/// cache.
async fn two_turns<T1, T2>(sims: &[SimHandle], turn1: T1, turn2: T2)
where
    T1: Future<Output = ()>,
    T2: Future<Output = ()>,
{
    let start = stats(sims);
    turn1.await;
    let first = stats(sims);
    turn2.await;
    let second = stats(sims);
    let reached = |from: &[(u64, u64, u64)], to: &[(u64, u64, u64)]| -> Vec<usize> {
        (0..sims.len()).filter(|&i| to[i].0 > from[i].0).collect()
    };
    let (before, after) = (reached(&start, &first), reached(&first, &second));
    assert_eq!(
        after.len(),
        1,
        "turn 2 on one backend: {first:?} -> {second:?}"
    );
    let i = after[0];
    assert!(
        before.contains(&i),
        "turn 2 on turn 1's backend ({before:?}, then {i})"
    );
    let sent = first[i].1 - start[i].1;
    let cached = second[i].2 - first[i].2;
    assert!(
        sent > 1000 && cached * 10 >= sent * 9,
        "turn 2: {cached} tokens from the cache, of turn 1's {sent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_keeps_its_session_on_one_backend() {
    let _heavy = heavy().await;
    let claude = bin("claude");
    let (sims, router) = fleet().await;
    let home = home("claude");
    let env = [
        ("ANTHROPIC_BASE_URL", router.url.clone()),
        ("ANTHROPIC_API_KEY", "dummy".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
    ];
    let turn = |args: &'static [&'static str]| run(&claude, args, &home, &env);
    two_turns(
        &sims,
        turn(&[
            "-p",
            "Turn 1: say hello",
            "--model",
            "qwen3",
            "--output-format",
            "json",
        ]),
        turn(&[
            "-p",
            "--continue",
            "Turn 2: say hello",
            "--model",
            "qwen3",
            "--output-format",
            "json",
        ]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_keeps_its_thread_on_one_backend() {
    let _heavy = heavy().await;
    let codex = bin("codex");
    let (sims, router) = fleet().await;
    let home = home("codex");
    let codex_home = home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    let config = format!(
        r#"model = "gpt-5.5"
model_provider = "mock"
[analytics]
enabled = false
[otel]
metrics_exporter = "none"
[features]
plugins = false
[model_providers.mock]
name = "mock"
base_url = "{}/v1"
wire_api = "responses"
env_key = "MOCK_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"#,
        router.url
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let env = [
        ("CODEX_HOME", codex_home.display().to_string()),
        ("MOCK_API_KEY", "dummy".into()),
    ];
    let turn = |args: &'static [&'static str]| run(&codex, args, &home, &env);
    two_turns(
        &sims,
        turn(&[
            "exec",
            "--skip-git-repo-check",
            "--json",
            "Turn 1: say hello",
        ]),
        turn(&[
            "exec",
            "--skip-git-repo-check",
            "--json",
            "resume",
            "--last",
            "Turn 2: say hello",
        ]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_keeps_its_session_on_one_backend() {
    let _heavy = heavy().await;
    let opencode = bin("opencode");
    let (sims, router) = fleet().await;
    let home = home("opencode");
    let config = home.join(".config/opencode");
    std::fs::create_dir_all(config.join("node_modules")).unwrap();
    let lock =
        r#"{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}"#;
    std::fs::write(config.join("package-lock.json"), lock).unwrap();
    let settings = serde_json::json!({
        "$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled",
        "model": "mock/qwen3", "small_model": "mock/qwen3",
        "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "Mock",
            "options": {"baseURL": format!("{}/v1", router.url), "apiKey": "dummy"},
            "models": {"qwen3": {"name": "qwen3"}}}}});
    std::fs::write(config.join("opencode.json"), settings.to_string()).unwrap();
    let dir = |d: &str| home.join(d).display().to_string();
    let env = [
        ("XDG_CONFIG_HOME", dir(".config")),
        ("XDG_DATA_HOME", dir(".local/share")),
        ("XDG_CACHE_HOME", dir(".cache")),
        ("XDG_STATE_HOME", dir(".local/state")),
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
        ("OPENCODE_DISABLE_SHARE", "1".into()),
        ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".into()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
    ];
    let turn = |args: &'static [&'static str]| run(&opencode, args, &home, &env);
    // Turn 1 sends OpenCode's title request first, a prefix of its own in the same
    // session: a conversation of its own, which must not take the session's backend.
    two_turns(
        &sims,
        turn(&[
            "run",
            "--format",
            "json",
            "-m",
            "mock/qwen3",
            "Turn 1: say hello",
        ]),
        turn(&[
            "run",
            "--format",
            "json",
            "-m",
            "mock/qwen3",
            "--continue",
            "Turn 2: say hello",
        ]),
    )
    .await;
}
