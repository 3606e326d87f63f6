# Helpers the real-time benchmarks share (sourced, not run): free ports, readiness waits,
# the router or a peer router started in front of a list of backends, and the processes
# started stopped again. Each caller runs from the repository's root and sets $out (a
# directory for logs) and $bin (the prefix-router executable), by bench_start or itself;
# ROUTER_BIN, when set, is the router started instead.
pids=()
bench_start() { # the router's release binary in $bin (built when missing), a log directory in $out (OUT, or a temporary one), every process started stopped on exit
  bin=target/release/prefix-router
  [ -x "$bin" ] || cargo build --release -p prefix-router-cli
  out="${OUT:-$(mktemp -d)}"
  mkdir -p "$out"
  trap stop EXIT
}
stop() { # the processes started here, each waited for (not other background jobs)
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ok() { # URL: up to 120 s for a 200
  for _ in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ] && return 0
    sleep 0.1
  done
  echo "no 200 from $1" >&2; return 1
}
start_sims() { # 4 fresh simulated vLLM backends, time divided by $speedup (default 1); sets urls
  urls=()
  for i in 0 1 2 3; do
    local p; p=$(free_port)
    "$bin" sim --count 1 --base-port "$p" --time-scale "${speedup:-1}" >"$out/sim-$i.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$p")
  done
  for u in "${urls[@]}"; do wait_ok "$u/health"; done
}
start_router() { # POLICY [URL...]: the router in front of URL..., ready; sets $port. Extra flags (other backends: BACKENDS says how many in all) in $ROUTER_ARGS.
  port=$(free_port); admin=$(free_port)
  local policy="$1"; shift
  local workers=(); [ $# = 0 ] || workers=(--worker-urls "$(IFS=,; echo "$*")")
  # shellcheck disable=SC2086
  "${ROUTER_BIN:-$bin}" --host 127.0.0.1 --port "$port" --admin-port "$admin" --policy "$policy" \
    "${workers[@]}" ${ROUTER_ARGS:-} >"$out/router-$port.log" 2>&1 &
  pids+=($!)
  wait_ok "http://127.0.0.1:$admin/health"
  for _ in $(seq 1 300); do # until every backend passed the router's health check
    ready=$(curl -s "http://127.0.0.1:$admin/stats" | python3 -c \
      'import json,sys; print(sum(b["ready"] for b in json.load(sys.stdin)["backends"]))' || echo 0)
    [ "$ready" = "${BACKENDS:-$#}" ] && return 0
    sleep 0.1
  done
  echo "the router's backends did not become ready" >&2; return 1
}
peer_bin() { # NAME: its executable, installed in a venv of its own under target/peers on first use
  local name=$1 version venv="target/peers/$1"
  case $name in smg) version=1.13.0 ;; vllm-router) version=0.1.17 ;; *) echo "unknown peer $name" >&2; return 1 ;; esac
  if [ ! -x "$venv/bin/$name" ]; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "$name==$version" >&2
  fi
  echo "$venv/bin/$name"
}
start_peer() { # NAME URL...: the peer (its default policy, cache_aware) in front of URL..., every backend registered; sets $port
  local name=$1 exe; shift
  exe=$(peer_bin "$name")
  port=$(free_port)
  local metrics; metrics=$(free_port)
  case $name in
    smg) "$exe" launch --host 127.0.0.1 --port "$port" --prometheus-port "$metrics" \
           --policy cache_aware --worker-urls "$@" >"$out/$name.log" 2>&1 & ;;
    vllm-router) "$exe" --host 127.0.0.1 --port "$port" --prometheus-port "$metrics" \
           --policy cache_aware --worker-urls "$@" >"$out/$name.log" 2>&1 & ;;
  esac
  pids+=($!)
  local list=/workers; [ "$name" = smg ] || list=/list_workers
  for _ in $(seq 1 600); do # until it lists every backend (healthy) (up to 60 s)
    healthy=$(curl -s "http://127.0.0.1:$port$list" | python3 -c 'import json, sys
w = json.load(sys.stdin)
print(sum(x["is_healthy"] for x in w.get("workers", [])) + len(w.get("urls", [])))' 2>/dev/null || echo 0)
    [ "$healthy" = "$#" ] && return 0
    sleep 0.1
  done
  echo "$name did not register its backends" >&2; return 1
}
