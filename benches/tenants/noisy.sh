#!/usr/bin/env bash
# A noisy neighbour, in real time: tenant A floods the fleet with 16 times tenant B's
# concurrency, in front of 4 `prefix-router sim` backends small enough to saturate
# (--max-num-seqs MAX_NUM_SEQS). B's TTFT alone, then beside A without a tenants file (the
# engines' own FCFS queues decide), then beside A with a tenants file of equal weights (the
# router holds the excess in its queue and serves the tenants' fair shares). Prints B's
# TTFT p50/p99, its slowest first turn, its later turns' p99 and its hit rate, and the
# requests each tenant got answered per second.
#
# Env: SPEEDUP (5), MAX_NUM_SEQS (2), B_SESSIONS (8), A_SESSIONS (128), B_CONCURRENCY and
# A_CONCURRENCY (requests in flight, default: the sessions), MAX_CONTEXT (60000 tokens a
# session grows to), RUNS (1), MODES (alone,no-tenants,tenants: which runs; rate:
# tenant A alone under TPM tokens_per_minute, default 6000000, its 429s sent again after
# their Retry-After, and what it is served in each of its first MINUTES (2) minutes; priority: B's sessions at x-priority high alone,
# then beside normal and low sessions of A's size that together keep twice the fleet's
# slots in flight, under --max-queued of half the slots),
# B_DELAY (2: seconds the neighbours run before B starts), B_SESSION_RATE (100: new
# sessions a second of B, and of `high` in the priority runs, in simulated time; the
# neighbours' start at 100 a second), STANDING_SLOTS (0: the tenants
# files' standing_slots), SCHEDULING (fcfs: the engines' --scheduling-policy; priority admits
# by the X-Vllm-Priority the router sets with a tenants file),
# OUT (a directory for logs, reports and the router's metrics when B finished).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
speedup="${SPEEDUP:-5}"
reads="${METRICS_INTERVAL:+--metrics-interval $METRICS_INTERVAL}"
b_sessions="${B_SESSIONS:-8}" a_sessions="${A_SESSIONS:-128}"
b_conc="${B_CONCURRENCY:-$b_sessions}" a_conc="${A_CONCURRENCY:-$a_sessions}"

hash() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
standing="standing_slots = ${STANDING_SLOTS:-0}"
cat >"$out/tenants.toml" <<TOML
$standing
[tenants.a]
keys = ["sha256:$(hash sk-tenant-a)"]
[tenants.b]
keys = ["sha256:$(hash sk-tenant-b)"]
TOML

start_sims() {
  urls=()
  for i in 0 1 2 3; do
    local p; p=$(free_port)
    "$bin" sim --count 1 --base-port "$p" --time-scale "$speedup" \
      --max-num-seqs "${MAX_NUM_SEQS:-2}" --scheduling-policy "${SCHEDULING:-fcfs}" >"$out/sim-$i.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$p")
  done
  for u in "${urls[@]}"; do wait_ok "$u/health"; done
}

replay() { # KEY SESSIONS CONCURRENCY SEED REPORT [more flags]: the agent workload as tenant KEY, $rate new sessions a second (100)
  local key=$1 sessions=$2 conc=$3 seed=$4 report=$5; shift 5
  "$bin" replay --url "http://127.0.0.1:$port" --synthetic agent --sessions "$sessions" \
    --session-rate "${rate:-100}" --concurrency "$conc" --seed "$seed" --max-context-tokens "${MAX_CONTEXT:-60000}" \
    --speedup "$speedup" --stream --quiet --backends 4 --timeout 600 --api-key "$key" \
    --model meta-llama/Llama-3.1-8B-Instruct --out "$report" --requests-out "${report%.json}.jsonl" "$@" >/dev/null
}

summary() { # REPORT: TTFT p50, p99, answered requests per second; from the requests written
  # next to it, the slowest first turn, the p99 of later turns, and the hit rate
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["ttft_ms"] or {}
q = r["requests"]
line = (f"ttft_p50={t.get('p50', 0) / 1000:.3f}s ttft_p99={t.get('p99', 0) / 1000:.3f}s "
        f"ok={q['ok']} failed={q['failed']} req/s={q['ok'] / r['elapsed_s']:.2f}")
rows = [json.loads(l) for l in open(sys.argv[1][:-len(".json")] + ".jsonl")]
rows = [x for x in rows if x.get("ttft_ms") is not None]
first = [x["ttft_ms"] for x in rows if x["turn"] == 0]
later = sorted(x["ttft_ms"] for x in rows if x["turn"] > 0)
prompt = sum(x["prompt_tokens"] for x in rows)
if first and later and prompt:
    line += (f" first_turns_max={max(first) / 1000:.3f}s"
             f" later_turns_p99={later[int(0.99 * (len(later) - 1))] / 1000:.3f}s"
             f" hit={sum(x['cached_tokens'] for x in rows) / prompt:.3f}")
print(line)
PY
}

run() { # NAME TENANTS_ARGS NEIGHBOUR(0/1) RUN
  start_sims
  ROUTER_ARGS="$2 $reads" start_router kv_aware "${urls[@]}"
  local a_pid=""
  if [ "$3" = 1 ]; then
    replay sk-tenant-a "$a_sessions" "$a_conc" 7 "$out/a-$1-$4.json" &
    a_pid=$!
    sleep "${B_DELAY:-2}"
  fi
  rate="${B_SESSION_RATE:-100}" replay sk-tenant-b "$b_sessions" "$b_conc" 1 "$out/b-$1-$4.json"
  curl -s "http://127.0.0.1:$admin/metrics" >"$out/metrics-$1-$4.txt"
  local a_line=""
  if [ -n "$a_pid" ]; then
    local a_done; a_done=$(curl -s "http://127.0.0.1:$admin/metrics" | awk '/^prefix_router_requests_total/ {n += $2} END {print n + 0}')
    kill "$a_pid" 2>/dev/null || true; wait "$a_pid" 2>/dev/null || true
    a_line=" (requests answered by then, both tenants: $a_done; preempted: $(metric prefix_router_tenant_preempted_total))"
  fi
  echo "$1 run=$4: B $(summary "$out/b-$1-$4.json")$a_line"
  stop
}

metric() { # NAME: the sum of a metric's series on the router's admin listener
  curl -s "http://127.0.0.1:$admin/metrics" | awk -v m="$1" '$1 ~ "^"m {n += $2} END {printf "%d", n + 0}'
}

rate_run() { # RUN: tenant A alone at TPM tokens a minute, retrying its 429s after Retry-After; what it is served in each of its first MINUTES minutes
  local tpm="${TPM:-6000000}" minutes="${MINUTES:-2}"
  printf '%s\n[tenants.a]\nkeys = ["sha256:%s"]\ntokens_per_minute = %s\n' "$standing" "$(hash sk-tenant-a)" "$tpm" >"$out/rate.toml"
  start_sims
  ROUTER_ARGS="--tenants-file $out/rate.toml $reads" start_router kv_aware "${urls[@]}"
  replay sk-tenant-a "$a_sessions" "$a_conc" 7 "$out/a-rate-$1.json" --retry-rate-limited &
  local a_pid=$! before=0
  for m in $(seq 1 "$minutes"); do
    local waited=0
    while [ "$waited" -lt 60 ] && kill -0 "$a_pid" 2>/dev/null; do sleep 1; waited=$((waited + 1)); done
    local served limited
    served=$(metric prefix_router_tenant_tokens_total); limited=$(metric prefix_router_tenant_rate_limited_total)
    echo "rate run=$1 minute=$m: tokens_per_minute=$tpm, served in ${waited} s: $((served - before))" \
      "($(python3 -c "print(f'{($served - $before) / $tpm:.4f}')")x), 429s so far: $limited"
    before=$served
  done
  kill "$a_pid" 2>/dev/null || true; wait "$a_pid" 2>/dev/null || true
  stop
}

priority_run() { # RUN: high-priority sessions alone, then beside normal and low ones that offer twice what the fleet runs
  local slots=$((4 * ${MAX_NUM_SEQS:-2}))
  printf '%s\n[tenants.p]\nkeys = ["sha256:%s"]\nmax_priority = "high"\n' "$standing" "$(hash sk-tenant-p)" >"$out/priority.toml"
  local args="--tenants-file $out/priority.toml --max-queued $((slots / 2)) $reads"
  start_sims
  ROUTER_ARGS="$args" start_router kv_aware "${urls[@]}"
  rate="${B_SESSION_RATE:-100}" replay sk-tenant-p "$b_sessions" "$b_conc" 1 "$out/high-alone-$1.json" --priority high
  echo "priority run=$1: high alone $(summary "$out/high-alone-$1.json")"
  stop
  start_sims
  ROUTER_ARGS="$args" start_router kv_aware "${urls[@]}"
  replay sk-tenant-p "$a_sessions" "$slots" 7 "$out/normal-$1.json" --priority normal &
  local n_pid=$!
  replay sk-tenant-p "$a_sessions" "$slots" 9 "$out/low-$1.json" --priority low &
  local l_pid=$!
  sleep "${B_DELAY:-2}"
  rate="${B_SESSION_RATE:-100}" replay sk-tenant-p "$b_sessions" "$b_conc" 1 "$out/high-$1.json" --priority high
  kill "$n_pid" "$l_pid" 2>/dev/null || true; wait "$n_pid" "$l_pid" 2>/dev/null || true
  echo "priority run=$1: high beside normal and low $(summary "$out/high-$1.json");" \
    "preempted: $(metric prefix_router_tenant_preempted_total);" \
    "shed: $(curl -s "http://127.0.0.1:$admin/metrics" | grep '^prefix_router_tenant_shed_total' | tr '\n' ' ')"
  stop
}

modes=",${MODES:-alone,no-tenants,tenants},"
for r in $(seq 1 "${RUNS:-1}"); do
  if [[ $modes == *,alone,* ]]; then run alone "--tenants-file $out/tenants.toml" 0 "$r"; fi
  if [[ $modes == *,no-tenants,* ]]; then run "beside-A-no-tenants" "" 1 "$r"; fi
  if [[ $modes == *,tenants,* ]]; then run "beside-A-tenants" "--tenants-file $out/tenants.toml" 1 "$r"; fi
  if [[ $modes == *,rate,* ]]; then rate_run "$r"; fi
  if [[ $modes == *,priority,* ]]; then priority_run "$r"; fi
done
