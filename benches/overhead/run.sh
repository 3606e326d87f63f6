#!/usr/bin/env bash
# Overhead benchmark: what the router costs per request next to nginx as a plain proxy and
# next to a bare Pingora pass-through (benches/passthrough: `upstream_peer` only).
#
# Starts one nginx worker as the upstream (two ports, each answering a fixed chat
# completion), nginx as a reference proxy (one worker, proxy_pass, keepalive 64), the
# Pingora pass-through and the router (cache_aware, both upstream ports as backends), then
# drives each with wrk for 1 KB chat bodies on 32 connections and 400 KB bodies (40
# messages) on 8. Prints req/s, latency p50/p99, CPU microseconds per request of the
# forwarding process (/proc/PID/stat over the run) and resident memory, with the router's
# figures as ratios to nginx's and to the pass-through's.
#
# Usage: benches/overhead/run.sh   (or: make overhead)
# Env: DURATION (seconds per run, default 15), ROUNDS (default 1), BASELINE (another
# prefix-router binary, run as forwarder `before` with the same flags, to compare two
# builds side by side), TOKENIZER (a tokenizer directory: the router also runs in token
# mode, as forwarder `tokens`), VLLM_ROUTER (vllm-router's executable, from
# `pip install vllm-router==0.1.17` in a venv: run as forwarder `vllmrt` with its kv_aware
# policy, which tokenizes with the model directory in VLLM_ROUTER_TOKENIZER = TOKENIZER; its
# KV event sources point at ports where nothing publishes), THREADS (data plane
# threads of the router and the pass-through, default: the number of CPUs, their default),
# PROFILE (a directory: record each router run with `perf record -g` into
# PROFILE/router-<KB>.data), TRACES (sampling ratios, e.g. 0,0.01,1: for each, a router with
# trace export on, as forwarder `traced-<ratio>`, exporting to one OTLP receiver on this
# machine that answers without decoding: tests/otlp/receiver.py --discard), TRACE_FAULTS
# (1: two more routers sampling every trace, `traced-dead` exporting to a port where nothing
# listens and `traced-slow` to a receiver that answers each export 5 s late), TLS (1: nginx
# and the router also serve the clients over TLS, as `nginx-tls` and `router-tls`, with one
# self-signed P-256 certificate made by openssl; wrk keeps its connections, so the cost is
# the records' encryption more than handshakes), EPP (1: Envoy 1.40 as a plain proxy over
# the same two backends, `envoy`, and Envoy with conf/envoy-epp.yaml asking the router run
# as its endpoint picker, `envoy-epp`, whose CPU and memory are both processes' together;
# both with THREADS workers).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
duration=${DURATION:-15}
rounds=${ROUNDS:-1}
threads=${THREADS:-$(nproc)}

install() {
  command -v wrk >/dev/null && command -v nginx >/dev/null && return
  local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq wrk nginx >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2; exit 1
}

# CPU ticks and resident KB of one forwarder: the sum over its processes (PIDs).
cpu_ticks() { local p t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
rss_kb() { local p k=0; for p in "$@"; do k=$((k + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done; echo $k; }

nginx_conf() { # name, server block
  cat > "$work/$1.conf" <<CONF
worker_processes 1;
master_process off;
daemon off;
pid $work/$1.pid;
error_log $work/$1.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  client_body_temp_path $work/$1.body;
  proxy_temp_path $work/$1.proxy;
  $2
}
CONF
}

install
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p prefix-router-cli -p prefix-router-passthrough
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

up1=$(free_port); up2=$(free_port); proxy=$(free_port); router=$(free_port); admin=$(free_port)
pass=$(free_port)
answer='{"id":"cmpl-1","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":256,"completion_tokens":1,"total_tokens":257}}'
nginx_conf upstream "server { listen 127.0.0.1:$up1; listen 127.0.0.1:$up2;
    location / { default_type application/json; return 200 '$answer'; } }"
nginx_conf proxy "upstream fleet { server 127.0.0.1:$up1; server 127.0.0.1:$up2; keepalive 64; }
  server { listen 127.0.0.1:$proxy;
    location / { proxy_pass http://fleet; proxy_http_version 1.1;
      proxy_set_header Connection \"\"; } }"
nginx -c "$work/upstream.conf" & wait_port "$up1"
nginx -c "$work/proxy.conf" & nginx_pid=$!; wait_port "$proxy"
RUST_LOG=warn "$root/target/release/prefix-router" serve --host 127.0.0.1 --port "$router" \
  --admin-port "$admin" --threads "$threads" --policy cache_aware \
  --upgrade-socket "$work/upgrade.sock" \
  --worker-urls "http://127.0.0.1:$up1,http://127.0.0.1:$up2" & router_pid=$!
"$root/target/release/prefix-router-passthrough" --listen "127.0.0.1:$pass" --threads "$threads" \
  --upstreams "127.0.0.1:$up1,127.0.0.1:$up2" & pass_pid=$!
wait_port "$router"; wait_port "$pass"; sleep 1
declare -A idle=([nginx]=$(rss_kb "$nginx_pid") [pingora]=$(rss_kb "$pass_pid") [router]=$(rss_kb "$router_pid"))
declare -A pid=([nginx]=$nginx_pid [pingora]=$pass_pid [router]=$router_pid)
declare -A port=([nginx]=$proxy [pingora]=$pass [router]=$router)
declare -A scheme=()
forwarders="nginx pingora router"

extra_router() { # name, binary, extra flags...
  local name=$1 binary=$2; shift 2
  local p a; p=$(free_port); a=$(free_port)
  RUST_LOG=warn "$binary" serve --host 127.0.0.1 --port "$p" --admin-port "$a" \
    --threads "$threads" --policy cache_aware --upgrade-socket "$work/$name.sock" \
    --worker-urls "http://127.0.0.1:$up1,http://127.0.0.1:$up2" "$@" &
  pid[$name]=$!; port[$name]=$p; wait_port "$p"; sleep 1
  idle[$name]=$(rss_kb "${pid[$name]}"); forwarders="$forwarders $name"
}
[ -z "${BASELINE:-}" ] || extra_router before "$BASELINE"
receiver() { # name, receiver.py flags: an OTLP receiver on this machine; its port in $receiver_port
  local name=$1 python; shift
  python=$("$root/tests/otlp/setup.sh" "$root/target/otlp")
  "$python" "$root/tests/otlp/receiver.py" "$@" >"$work/$name.port" &
  for _ in $(seq 100); do [ -s "$work/$name.port" ] && break; sleep 0.1; done
  receiver_port=$(head -1 "$work/$name.port")
  wait_port "$receiver_port"
}
if [ -n "${TRACES:-}" ]; then
  receiver sink --discard
  IFS=, read -ra ratios <<<"$TRACES"
  for r in "${ratios[@]}"; do
    extra_router "traced-$r" "$root/target/release/prefix-router" \
      --otlp-endpoint "http://127.0.0.1:$receiver_port" --trace-sample-ratio "$r"
  done
fi
if [ -n "${TRACE_FAULTS:-}" ]; then
  extra_router traced-dead "$root/target/release/prefix-router" \
    --otlp-endpoint "http://127.0.0.1:$(free_port)" --trace-sample-ratio 1
  receiver slow --discard --delay 5
  extra_router traced-slow "$root/target/release/prefix-router" \
    --otlp-endpoint "http://127.0.0.1:$receiver_port" --trace-sample-ratio 1
fi
if [ -n "${TLS:-}" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -keyout "$work/tls.key" -out "$work/tls.pem" 2>/dev/null
  p=$(free_port)
  nginx_conf proxy-tls "upstream fleet { server 127.0.0.1:$up1; server 127.0.0.1:$up2; keepalive 64; }
  server { listen 127.0.0.1:$p ssl; ssl_certificate $work/tls.pem; ssl_certificate_key $work/tls.key;
    location / { proxy_pass http://fleet; proxy_http_version 1.1;
      proxy_set_header Connection \"\"; } }"
  nginx -c "$work/proxy-tls.conf" & pid[nginx-tls]=$!; port[nginx-tls]=$p; wait_port "$p"
  idle[nginx-tls]=$(rss_kb "${pid[nginx-tls]}"); scheme[nginx-tls]=https
  forwarders="$forwarders nginx-tls"
  extra_router router-tls "$root/target/release/prefix-router" \
    --tls-cert-file "$work/tls.pem" --tls-key-file "$work/tls.key"
  scheme[router-tls]=https
fi
[ -z "${TOKENIZER:-}" ] || extra_router tokens "$root/target/release/prefix-router" --tokenizer "$TOKENIZER"
if [ -n "${VLLM_ROUTER:-}" ]; then
  p=$(free_port); e1=$(free_port); e2=$(free_port)
  VLLM_ROUTER_TOKENIZER="${TOKENIZER:?VLLM_ROUTER needs TOKENIZER}" RUST_LOG=warn "$VLLM_ROUTER" \
    --host 127.0.0.1 --port "$p" --policy kv_aware \
    --worker-urls "http://127.0.0.1:$up1" "http://127.0.0.1:$up2" \
    --kv-event-source "http://127.0.0.1:$up1=tcp://127.0.0.1:$e1" \
    --kv-event-source "http://127.0.0.1:$up2=tcp://127.0.0.1:$e2" \
    --kv-event-model "$TOKENIZER" >"$work/vllm-router.log" 2>&1 &
  pid[vllmrt]=$!; port[vllmrt]=$p; wait_port "$p"; sleep 2
  idle[vllmrt]=$(rss_kb "${pid[vllmrt]}"); forwarders="$forwarders vllmrt"
fi
if [ -n "${EPP:-}" ]; then
  envoy=$("$root/tests/envoy/setup.sh" "$root/target/envoy" | tail -1)
  start_envoy() { # name, config file: Envoy with $threads workers; its PID in $envoy_pid
    "$envoy" -c "$2" --disable-hot-restart --concurrency "$threads" -l error \
      >"$work/$1.log" 2>&1 & envoy_pid=$!
  }
  p=$(free_port) a=$(free_port)
  cat > "$work/envoy.yaml" <<CONF
admin: { address: { socket_address: { address: 127.0.0.1, port_value: $a } } }
static_resources:
  listeners:
  - address: { socket_address: { address: 127.0.0.1, port_value: $p } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: plain
          route_config:
            virtual_hosts:
            - { name: all, domains: ["*"], routes: [{ match: { prefix: "/" }, route: { cluster: fleet } }] }
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: fleet
    type: STATIC
    load_assignment:
      cluster_name: fleet
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $up1 } } }
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $up2 } } }
CONF
  start_envoy envoy "$work/envoy.yaml"
  pid[envoy]=$envoy_pid; port[envoy]=$p; wait_port "$p"; sleep 1
  idle[envoy]=$(rss_kb "$envoy_pid"); forwarders="$forwarders envoy"
  p=$(free_port) a=$(free_port) g=$(free_port) ea=$(free_port)
  RUST_LOG=warn "$root/target/release/prefix-router" epp --host 127.0.0.1 --grpc-port "$g" \
    --admin-port "$a" --threads "$threads" --policy cache_aware \
    --worker-urls "http://127.0.0.1:$up1,http://127.0.0.1:$up2" & epp_pid=$!
  sed -e "s/__LISTEN_PORT__/$p/" -e "s/__EPP_PORT__/$g/" -e "s/__ADMIN_PORT__/$ea/" \
    "$root/conf/envoy-epp.yaml" > "$work/envoy-epp.yaml"
  start_envoy envoy-epp "$work/envoy-epp.yaml"
  pid[envoy-epp]="$envoy_pid $epp_pid"; port[envoy-epp]=$p; wait_port "$p"; wait_port "$g"; sleep 1
  idle[envoy-epp]=$(rss_kb "$envoy_pid" "$epp_pid"); forwarders="$forwarders envoy-epp"
fi

run() { # forwarder, body KB, connections -> one result line
  local name=$1 kb=$2 conns=$3 url="${scheme[$1]:-http}://127.0.0.1:${port[$1]}"
  BODY_KB=$kb wrk -t1 -c"$conns" -d2s -s "$here/chat.lua" "$url" >/dev/null
  # shellcheck disable=SC2086 # a forwarder may be several processes
  local before; before=$(cpu_ticks ${pid[$name]}) perf=""
  if [ -n "${PROFILE:-}" ] && [ "$name" = router ]; then
    mkdir -p "$PROFILE"
    perf record -q -g -F 499 -p "${pid[$name]}" -o "$PROFILE/router-$kb.data" -- sleep "$duration" &
    perf=$!
  fi
  local out; out=$(BODY_KB=$kb wrk -t1 -c"$conns" -d"${duration}s" -s "$here/chat.lua" "$url" | grep '^{')
  # shellcheck disable=SC2086
  local ticks=$(( $(cpu_ticks ${pid[$name]}) - before ))
  [ -z "$perf" ] || wait "$perf"
  # shellcheck disable=SC2086
  echo "$name $kb $conns $ticks $(getconf CLK_TCK) $(rss_kb ${pid[$name]}) ${idle[$name]} $out"
}

results=$work/results
for _ in $(seq "$rounds"); do
  for load in "1 32" "400 8"; do
    for name in $forwarders; do run "$name" $load | tee -a "$results" >&2; done
  done
done
curl -s "http://127.0.0.1:$admin/metrics" | grep -E '^prefix_router_(tree_bytes|requests_total)' >&2 || true

awk -f "$here/report.awk" "$results"
