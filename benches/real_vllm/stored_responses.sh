#!/usr/bin/env bash
# Stored Responses through the router, in front of 4 real vLLM instances with the store on
# (VLLM_ENABLE_RESPONSES_API_STORE=1: each keeps its responses in its own process). With
# the official openai SDK: CHAINS chains of a stored response and FOLLOW_UPS follow-ups
# each naming the one before (`previous_response_id`), then a retrieve of the last; behind
# one router, then behind 2 replicas sharing their table through a redis-server, each
# request to the next replica. Prints one line per front: follow-ups answered, retrieves
# answered, and the first failure. ROUTER_BIN runs another build in place of this one.
#
# Env: CHAINS (4), FOLLOW_UPS (20), FRONTS (one,replicas), OUT (a directory for logs).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
source benches/real_vllm/vllm.sh
VENV=target/sdk-venv
[ -x "$VENV/bin/python" ] || tests/sdk/run.sh "$bin" >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import openai' || { echo "the openai SDK: run tests/sdk/run.sh first" >&2; exit 1; }
max_len=4096
blocks=$((2 * (max_len / block + 1)))

urls=(); engines=()
trap 'stop; for e in "${engines[@]}"; do kill "$e" 2>/dev/null || true; done; wait' EXIT
for i in 0 1 2 3; do
  p=$(free_port)
  VLLM_ENABLE_RESPONSES_API_STORE=1 serve_vllm "$out/engine-$i" "$p" $((i % 2)) "$blocks" "$max_len" 4
  engines+=($!)
  urls+=("http://127.0.0.1:$p")
done
wait_healthy "${urls[@]}"

chains() { # NAME URL...: the chains through URL... in turn, one line
  "$VENV/bin/python" - "$1" "${CHAINS:-4}" "${FOLLOW_UPS:-20}" "${@:2}" <<'PY'
import sys
import openai
name, chains, follow_ups, urls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
clients = [openai.OpenAI(base_url=u + "/v1", api_key="dummy", max_retries=0, timeout=120) for u in urls]
sent = answered = retrieved = 0
first_failure = None
turn = 0
def client():
    global turn
    turn += 1
    return clients[turn % len(clients)]
for chain in range(chains):
    r = client().responses.create(model="tiny", input=f"Chain {chain}: plan the work.", store=True,
                                  max_output_tokens=8)
    for i in range(follow_ups):
        sent += 1
        try:
            r = client().responses.create(model="tiny", input=f"Step {i}: go on.", store=True,
                                          previous_response_id=r.id, max_output_tokens=8)
            answered += 1
        except openai.APIError as e:
            first_failure = first_failure or f"{type(e).__name__}: {e}"
            break
    try:
        client().responses.retrieve(r.id)
        retrieved += 1
    except openai.APIError as e:
        first_failure = first_failure or f"retrieve: {type(e).__name__}: {e}"
print(f"{name:10} follow-ups answered {answered}/{chains * follow_ups} (sent {sent}), "
      f"retrieved {retrieved}/{chains}" + (f"; first failure: {first_failure[:160]}" if first_failure else ""),
      flush=True)
PY
}

IFS=, read -ra fronts <<<"${FRONTS:-one,replicas}"
for front in "${fronts[@]}"; do
  case $front in
    one)
      start_router kv_aware "${urls[@]}"
      chains one "http://127.0.0.1:$port"
      stop ;;
    replicas)
      rport=$(free_port)
      redis-server --port "$rport" --save '' --appendonly no >"$out/redis.log" 2>&1 &
      pids+=($!)
      for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
      targets=()
      for _ in 1 2; do
        ROUTER_ARGS="--shared-table redis://127.0.0.1:$rport" start_router kv_aware "${urls[@]}"
        targets+=("http://127.0.0.1:$port")
      done
      chains replicas "${targets[@]}"
      stop ;;
  esac
done
