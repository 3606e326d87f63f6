#!/usr/bin/env bash
# Where the CPU of Envoy with the endpoint picker goes: one nginx worker answers a fixed
# chat completion on two ports (as in benches/overhead), `prefix-router epp` (cache_aware,
# 2 threads) picks between them, and Envoy 1.40 (conf/envoy-epp.yaml, 2 workers) carries
# the traffic; wrk sends 1 KB chats on 32 connections, then 400 KB chats on 8 (2 s warm-up,
# then DURATION s). Prints each process's CPU microseconds per request.
#
# Usage: benches/epp/split.sh   Env: DURATION (8), REQUEST_MODE (FULL_DUPLEX_STREAMED, or
# BUFFERED), RESPONSE_MODE (FULL_DUPLEX_STREAMED, or STREAMED).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
chat=$root/benches/overhead/chat.lua
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on port $1" >&2; exit 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p prefix-router-cli
envoy=$("$root/tests/envoy/setup.sh" "$root/target/envoy" | tail -1)
up1=$(free_port) up2=$(free_port)
answer='{"id":"cmpl-1","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":256,"completion_tokens":1,"total_tokens":257}}'
cat > "$work/upstream.conf" <<CONF
worker_processes 1; master_process off; daemon off; pid $work/up.pid; error_log $work/up.err warn;
events { worker_connections 4096; }
http { access_log off; client_max_body_size 64m; client_body_buffer_size 1m;
  client_body_temp_path $work/body; proxy_temp_path $work/proxy;
  server { listen 127.0.0.1:$up1; listen 127.0.0.1:$up2;
    location / { default_type application/json; return 200 '$answer'; } } }
CONF
nginx -c "$work/upstream.conf" & wait_port "$up1"
listen=$(free_port) admin=$(free_port) grpc=$(free_port) envoy_admin=$(free_port)
RUST_LOG=warn "$root/target/release/prefix-router" epp --host 127.0.0.1 --grpc-port "$grpc" \
  --admin-port "$admin" --threads 2 --policy cache_aware \
  --worker-urls "http://127.0.0.1:$up1,http://127.0.0.1:$up2" & picker=$!
sed -e "s/__LISTEN_PORT__/$listen/" -e "s/__EPP_PORT__/$grpc/" -e "s/__ADMIN_PORT__/$envoy_admin/" \
  -e "s/request_body_mode: FULL_DUPLEX_STREAMED/request_body_mode: ${REQUEST_MODE:-FULL_DUPLEX_STREAMED}/" \
  -e "s/response_body_mode: FULL_DUPLEX_STREAMED/response_body_mode: ${RESPONSE_MODE:-FULL_DUPLEX_STREAMED}/" \
  "$root/conf/envoy-epp.yaml" > "$work/envoy.yaml"
"$envoy" -c "$work/envoy.yaml" --disable-hot-restart --concurrency 2 -l error >"$work/envoy.log" 2>&1 &
proxy=$!
wait_port "$listen"; wait_port "$grpc"; sleep 1
for load in "1 32" "400 8"; do
  read -r kb conns <<<"$load"
  BODY_KB=$kb wrk -t1 -c"$conns" -d2s -s "$chat" "http://127.0.0.1:$listen" >/dev/null
  e0=$(ticks $proxy) p0=$(ticks $picker)
  out=$(BODY_KB=$kb wrk -t1 -c"$conns" -d"${DURATION:-8}s" -s "$chat" "http://127.0.0.1:$listen" | grep '^{')
  e1=$(ticks $proxy) p1=$(ticks $picker)
  n=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["requests"])' "$out")
  us() { echo $(( $1 * 1000000 / $(getconf CLK_TCK) / n )); }
  echo "$kb KB: $n requests; Envoy $(us $((e1 - e0))) us, picker $(us $((p1 - p0))) us a request"
done
