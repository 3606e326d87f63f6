#!/usr/bin/env python3
"""A real Prometheus scraping the router's admin /metrics every second while a short replay
runs through the router in front of simulated vLLM backends; then checks through
Prometheus's HTTP API (/api/v1/query):

  (a) increase()/rate() of prefix_router_requests_total against what the replay reports it
      sent (tolerance derived from how increase() works, see check_requests);
  (b) the predicted hit rate (matched_bytes_total / text_bytes_total) and the delivered one
      (backend_cached_tokens_total / backend_prompt_tokens_total): both computable, their
      gap reported; delivered tokens equal to the replay's own client-side token counts;
  (c) histogram_quantile(0.99, ... upstream_first_byte_seconds_bucket ...) is a number;
  (d) every "expr" of conf/grafana-dashboard.json evaluates without error and returns data
      ($__rate_interval -> 30s, $__interval -> 1s, $__range -> the run's span, any
      $backend-like variable -> .*).
Also: `promtool check metrics` on the exposition, and the official Python client's parser
(prometheus-client) reads it.

Usage: test_prometheus.py [--workload agent|conversation] [--runs N] [ROUTER_BINARY]
       (binary else $PREFIX_ROUTER, else target/debug/prefix-router; prometheus on PATH or
       $PROMETHEUS). Prints one line per check and 'N passed, N failed'; exits 1 on a failure.
STRICT=1 also fails on the known bugs listed in KNOWN_EMPTY.
"""

import argparse
import atexit
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DASHBOARD = os.path.join(REPO, "conf", "grafana-dashboard.json")
TRACE = "/work/shared/traces/conversation_trace.jsonl"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SCRAPE_S = 1
RATE_INTERVAL = "30s"  # Grafana's $__rate_interval: max($__interval + scrape, 4 x scrape); 30s is a typical value
DEADLINE_S = 600

# Dashboard expressions known to return nothing on a fresh router, and why (reported as
# KNOWN-BUG, failing only with STRICT=1; an entry that starts returning data is reported).
KNOWN_EMPTY: dict = {}

WORKLOADS = {
    # replay arguments, sim --time-scale (= the replay's --speedup: the sims run trace time)
    "agent": (["--synthetic", "agent", "--sessions", "6", "--speedup", "5", "--max-requests", "300"], 5),
    "conversation": (["--trace", TRACE, "--speedup", "2", "--max-requests", "300"], 2),
}

# Largest |predicted - delivered| hit-rate gap asserted, in points, per workload. agent: 3
# runs measured +0.03 each (it is nearly deterministic), so 1.0 holds with a wide margin.
# conversation (first 300 requests of the Mooncake trace, 4 sims): 3 runs measured +3.6 to
# +4.1 with the default max_tree_size (4 MiB of text per backend, 2.5x the sim's 420K-token
# KV cache, so the router believes in prefixes the sim has evicted) and +0.56 with
# --max-tree-size 1680000 (the KV cache's size): reported, not asserted.
MAX_GAP_POINTS = {"agent": 1.0}

# ---------------------------------------------------------------- processes

_children = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, log_path):
    log = open(log_path, "wb")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    p.log_path, p._log = log_path, log
    _children.append(p)
    return p


def stop(p):
    if p.poll() is None:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    p._log.close()


def cleanup():
    while _children:
        stop(_children.pop())


def _on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


atexit.register(cleanup)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def tail(p, n=15):
    with open(p.log_path, "rb") as f:
        return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")


def http_get(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError) as e:
        return None, str(e).encode()


def wait_until(what, cond, deadline_s, procs=()):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: {p.args[0]} exited with {p.returncode}:\n{tail(p)}")
        if cond():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not reached within {deadline_s} s")


# ---------------------------------------------------------------- checks

results, known = [], []


def record(name, ok, detail=""):
    results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}", flush=True)


class Prom:
    def __init__(self, url):
        self.url = url

    def query(self, expr, at):
        """(status, result list, error text) of an instant query at unix time `at`."""
        q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        status, body = http_get(f"{self.url}/api/v1/query?{q}", timeout=10)
        try:
            doc = json.loads(body)
        except ValueError:
            return "error", [], f"HTTP {status}: {body[:200]!r}"
        if doc.get("status") != "success":
            return "error", [], f"{doc.get('errorType')}: {doc.get('error')}"
        return "success", doc["data"]["result"], ""

    def query_range(self, expr, start, end, step):
        q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"})
        status, body = http_get(f"{self.url}/api/v1/query_range?{q}", timeout=10)
        try:
            doc = json.loads(body)
        except ValueError:
            return "error", [], f"HTTP {status}: {body[:200]!r}"
        if doc.get("status") != "success":
            return "error", [], f"{doc.get('errorType')}: {doc.get('error')}"
        return "success", doc["data"]["result"], ""

    def scalar(self, expr, at):
        """The single value of `expr` at `at` (raises if not exactly one series)."""
        status, res, err = self.query(expr, at)
        if status != "success":
            raise AssertionError(f"{expr}: {err}")
        if len(res) != 1:
            raise AssertionError(f"{expr}: {len(res)} series, expected 1: {res}")
        return float(res[0]["value"][1])


def dashboard_exprs():
    out = []

    def walk(o, title):
        if isinstance(o, dict):
            title = o.get("title", title)
            for k, v in o.items():
                if k == "expr" and isinstance(v, str):
                    out.append((title, v))
                else:
                    walk(v, title)
        elif isinstance(o, list):
            for x in o:
                walk(x, title)

    with open(DASHBOARD) as f:
        walk(json.load(f), "?")
    return out


def substitute(expr, range_s):
    subs = {"__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_S}s", "__range": f"{range_s}s",
            "__range_s": str(range_s)}

    def one(m):
        name = m.group(1) or m.group(2)
        if name in subs:
            return subs[name]
        return ".*"  # a template variable (e.g. $backend in backend=~"$backend"): match everything

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def run_once(binary, workload, n_sims, work, run_no, router_args=()):
    replay_args, time_scale = WORKLOADS[workload]
    print(f"--- run {run_no}: workload {workload}, {n_sims} sims (time-scale {time_scale}) ---", flush=True)
    sims = []
    for _ in range(n_sims):
        port = free_port()
        p = spawn([binary, "sim", "--count", "1", "--base-port", str(port), "--time-scale", str(time_scale)],
                  os.path.join(work, f"sim-{port}.log"))
        p.url = f"http://127.0.0.1:{port}"
        sims.append(p)
    for s in sims:
        wait_until(f"sim {s.url} healthy", lambda: http_get(s.url + "/health")[0] == 200, 15, [s])

    port, admin = free_port(), free_port()
    router = spawn([binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin),
                    "--worker-urls", ",".join(s.url for s in sims), "--health-check-interval", "1",
                    "--upgrade-socket", os.path.join(work, f"router-{port}.sock"), *router_args],
                   os.path.join(work, f"router-{port}.log"))
    router_url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"

    def all_healthy():
        st, body = http_get(admin_url + "/workers")
        return st == 200 and all(w["healthy"] for w in json.loads(body)["workers"])
    wait_until("router backends healthy", all_healthy, 20, [router])

    prom_port = free_port()
    pdir = os.path.join(work, f"prom-{run_no}")
    os.makedirs(pdir)
    with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
        f.write(f"""global:
  scrape_interval: {SCRAPE_S}s
  scrape_timeout: {SCRAPE_S}s
  evaluation_interval: {SCRAPE_S}s
scrape_configs:
  - job_name: prefix-router
    static_configs:
      - targets: ['127.0.0.1:{admin}']
""")
    prom_bin = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
    prom = spawn([prom_bin, f"--config.file={pdir}/prometheus.yml", f"--storage.tsdb.path={pdir}/data",
                  f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h",
                  "--log.level=warn"], os.path.join(pdir, "prometheus.log"))
    P = Prom(f"http://127.0.0.1:{prom_port}")
    wait_until("prometheus ready", lambda: http_get(P.url + "/-/ready")[0] == 200, 30, [prom])

    def scraped():
        st, res, _ = P.query('up{job="prefix-router"}', time.time())
        return st == "success" and res and res[0]["value"][1] == "1"
    wait_until("prometheus scraping the router", scraped, 20, [prom])
    time.sleep(2 * SCRAPE_S)

    report_path = os.path.join(work, f"replay-{run_no}.json")
    t_start = time.time()
    rp = spawn([binary, "replay", "--url", router_url, *replay_args, "--stream", "--model", MODEL,
                "--timeout", "60", "--duration", "120", "--quiet", "--out", report_path],
               os.path.join(work, f"replay-{run_no}.log"))
    try:
        rp.wait(240)
    except subprocess.TimeoutExpired:
        raise RuntimeError("replay still running after 240 s")
    t_end = time.time()
    stop(rp)
    _children.remove(rp)
    if rp.returncode != 0:
        raise RuntimeError(f"replay exited {rp.returncode}:\n{tail(rp, 40)}")
    print(tail(rp, 40), flush=True)
    with open(report_path) as f:
        rep = json.load(f)
    time.sleep(3 * SCRAPE_S)  # let the last increments be scraped
    at = time.time()
    span = math.ceil(at - t_start) + 5  # seconds: a range covering the whole replay and a few scrapes before
    figures = {"elapsed_s": rep["elapsed_s"], "sent": rep["requests"]["sent"]}
    tag = f"[run {run_no}]"

    # ---- raw exposition: promtool lint, the official client's parser, equal to Prometheus
    st, raw = http_get(admin_url + "/metrics")
    lint = subprocess.run([shutil.which("promtool") or "/usr/bin/promtool", "check", "metrics"], input=raw,
                          capture_output=True, timeout=30)
    record(f"{tag} promtool check metrics", lint.returncode == 0,
           (lint.stdout + lint.stderr).decode().strip()[:500] or "clean")
    try:
        fams = {f.name: f for f in text_string_to_metric_families(raw.decode())}
        record(f"{tag} prometheus-client parses /metrics", bool(fams), f"{len(fams)} families")
    except Exception as e:  # noqa: BLE001
        record(f"{tag} prometheus-client parses /metrics", False, f"{type(e).__name__}: {e}")

    # ---- (a) requests: exact totals, then increase() and rate() within a derived tolerance
    try:
        sent, ok = rep["requests"]["sent"], rep["requests"]["ok"]
        total = P.scalar('sum(prefix_router_requests_total{route="chat"})', at)
        total_ok = P.scalar('sum(prefix_router_requests_total{route="chat",status="200"})', at)
        record(f"{tag} (a) sum(prefix_router_requests_total{{route=\"chat\"}}) == replay sent",
               total == sent and total_ok == ok, f"prometheus {total:.0f} (200: {total_ok:.0f}), replay sent {sent} (ok {ok})")

        inc = P.scalar(f'sum(increase(prefix_router_requests_total{{route="chat"}}[{span}s]))', at)
        # increase() over a range that starts before the series exist: Prometheus (2.42) does not
        # assume a new series started at 0, so what a series counted before its first scrape is
        # lost (its first sample). It then extrapolates: toward the range start by half an
        # average sample interval (a new series starts far from it), toward the end by the gap
        # to the range end (< 1.1 sample interval); the slope there is at most the average
        # rate (the range also holds the flat samples after the replay). So, +1 for rounding:
        #   sent - sum(first samples) - 1 <= increase <= sent + 1.5 x avg rate x scrape interval + 1
        # and the window must stay under 10% of what was sent (else scrapes went missing).
        st, res, err = P.query(f'prefix_router_requests_total{{route="chat"}}[{span}s]', at)
        first = sum(float(s["values"][0][1]) for s in res)
        avg_rate = sent / rep["elapsed_s"]
        lo, hi = sent - first - 1, sent + 1.5 * avg_rate * SCRAPE_S + 1
        tol_ok = lo <= inc <= hi and (hi - lo) <= 0.1 * sent
        record(f"{tag} (a) increase(prefix_router_requests_total[{span}s]) ~ replay sent", tol_ok,
               f"increase {inc:.1f}, sent {sent}, allowed [{lo:.1f}, {hi:.1f}] "
               f"(first samples {first:.0f} over {len(res)} series, avg {avg_rate:.2f} req/s)")
        figures["increase"] = inc

        # rate() over the replay's own span, evaluated at its end: the replay's req/s.
        dur = max(2, round(t_end - t_start))
        r = P.scalar(f'sum(rate(prefix_router_requests_total{{route="chat"}}[{dur}s]))', t_end + SCRAPE_S)
        want = rep["throughput"]["requests_per_s"]
        rlo, rhi = (lo - avg_rate * SCRAPE_S) / dur, (hi + avg_rate * SCRAPE_S) / dur
        record(f"{tag} (a) rate(prefix_router_requests_total[{dur}s]) ~ replay req/s", rlo <= r <= rhi,
               f"rate {r:.3f}/s, replay {want:.3f}/s, allowed [{rlo:.3f}, {rhi:.3f}]")
        figures["rate"], figures["replay_rps"] = r, want
    except AssertionError as e:
        record(f"{tag} (a) requests", False, str(e))

    # ---- (b) predicted and delivered hit rates
    try:
        pred = P.scalar("sum(prefix_router_matched_bytes_total) / sum(prefix_router_text_bytes_total)", at)
        deliv = P.scalar("sum(prefix_router_backend_cached_tokens_total) / sum(prefix_router_backend_prompt_tokens_total)", at)
        prompt = P.scalar("sum(prefix_router_backend_prompt_tokens_total)", at)
        cached = P.scalar("sum(prefix_router_backend_cached_tokens_total)", at)
        ok_b = all(math.isfinite(x) and 0 <= x <= 1 for x in (pred, deliv))
        record(f"{tag} (b) predicted and delivered hit rates computable", ok_b,
               f"predicted {pred:.2%}, delivered {deliv:.2%}, gap {100 * (pred - deliv):+.2f} points")
        record(f"{tag} (b) delivered tokens == the replay's own usage sums",
               prompt == rep["tokens"]["prompt"] and cached == rep["tokens"]["cached"],
               f"prometheus prompt {prompt:.0f} cached {cached:.0f}; replay prompt {rep['tokens']['prompt']} "
               f"cached {rep['tokens']['cached']} (replay hit rate {rep['hit_rate']:.2%}, bound {rep['bound']['hit_rate']:.2%})")
        figures.update(predicted=pred, delivered=deliv, gap_points=100 * (pred - deliv),
                       replay_hit=rep["hit_rate"], bound=rep["bound"]["hit_rate"])
    except AssertionError as e:
        record(f"{tag} (b) hit rates", False, str(e))

    # ---- (c) TTFB p99 from the histogram
    try:
        p99 = P.scalar(f"histogram_quantile(0.99, sum by (le) (rate(prefix_router_upstream_first_byte_seconds_bucket[{span}s])))", at)
        p50 = P.scalar(f"histogram_quantile(0.5, sum by (le) (rate(prefix_router_upstream_first_byte_seconds_bucket[{span}s])))", at)
        record(f"{tag} (c) histogram_quantile(0.99, upstream_first_byte_seconds) is a number",
               math.isfinite(p99) and p99 > 0,
               f"p99 {p99 * 1000:.1f} ms, p50 {p50 * 1000:.1f} ms (replay TTFT p99 {rep['ttft_ms']['p99']:.1f} ms, "
               f"p50 {rep['ttft_ms']['p50']:.1f} ms)")
        figures.update(ttfb_p99_ms=p99 * 1000, ttfb_p50_ms=p50 * 1000, replay_ttft_p99_ms=rep["ttft_ms"]["p99"])
    except AssertionError as e:
        record(f"{tag} (c) first-byte quantile", False, str(e))

    # ---- (d) the dashboard's expressions
    exprs = dashboard_exprs()
    bad = []
    for title, expr in exprs:
        q = substitute(expr, span)
        st, res, err = P.query(q, t_end)
        st_r, res_r, err_r = P.query_range(q, t_start, at, 2)
        nan = sum(1 for s in res if not math.isfinite(float(s["value"][1])))
        if st != "success" or st_r != "success":
            bad.append((expr, f"error: {err or err_r}"))
            record(f"{tag} (d) dashboard '{title}': {q}", False, f"error: {err or err_r}")
        elif not res and not res_r:
            if expr in KNOWN_EMPTY:
                known.append((f"dashboard '{title}': {expr}", KNOWN_EMPTY[expr]))
                print(f"KNOWN-BUG {tag} (d) dashboard '{title}': {q} returns no data: {KNOWN_EMPTY[expr]}", flush=True)
            else:
                bad.append((expr, "no data"))
                record(f"{tag} (d) dashboard '{title}': {q}", False, "no data (instant and range)")
        else:
            note = f"{len(res)} series at replay end" + (f", {nan} NaN (0/0: a backend that got nothing)" if nan else "")
            if not res:
                note = f"no series at replay end, {len(res_r)} over the run"
            if expr in KNOWN_EMPTY:
                note += " (listed in KNOWN_EMPTY but has data now: drop it)"
            record(f"{tag} (d) dashboard '{title}': {q}", True, note)
    figures["dashboard_exprs"] = len(exprs)

    for p in (prom, router, *sims):
        stop(p)
        if p in _children:
            _children.remove(p)
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=os.environ.get("PREFIX_ROUTER", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "debug", "prefix-router")))
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default=os.environ.get("WORKLOAD", "agent"))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "1")))
    ap.add_argument("--sims", type=int, default=3, help="simulated backends (2-4)")
    ap.add_argument("--router-args", default=os.environ.get("ROUTER_ARGS", ""),
                    help="extra flags for `prefix-router serve`, e.g. '--max-tree-size 1680000'")
    ap.add_argument("--max-gap-points", type=float, default=None,
                    help="fail if |predicted - delivered| exceeds this many points (default: 1.0 for agent, "
                         "where 3 runs measured 0.03; none for conversation, where 3 runs measured 3.6-4.1)")
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        print(f"router binary not executable: {a.binary}", file=sys.stderr)
        return 2
    if a.workload == "conversation" and not os.path.exists(TRACE):
        print(f"trace missing: {TRACE}", file=sys.stderr)
        return 2
    version = subprocess.run([os.environ.get("PROMETHEUS") or "prometheus", "--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    work = tempfile.mkdtemp(prefix="prom-test-")
    print(f"{version}; router {a.binary}; work dir {work}", flush=True)
    t0 = time.monotonic()
    runs = [run_once(a.binary, a.workload, a.sims, work, i + 1, shlex.split(a.router_args)) for i in range(a.runs)]
    if a.max_gap_points is None:
        a.max_gap_points = MAX_GAP_POINTS.get(a.workload)
    gaps = [r["gap_points"] for r in runs if "gap_points" in r]
    if a.max_gap_points is not None and gaps:
        worst = max(abs(g) for g in gaps)
        record(f"(b) |predicted - delivered| <= {a.max_gap_points} points", worst <= a.max_gap_points,
               f"worst {worst:.2f} points over {len(gaps)} run(s)")
    for name, why in known:
        if os.environ.get("STRICT") == "1":
            record(name, False, why)
    print(f"\nSummary ({a.workload}, {a.sims} sims, {len(runs)} run(s), router args {a.router_args!r}, "
          f"{time.monotonic() - t0:.0f} s):")
    for i, r in enumerate(runs, 1):
        print(f"  run {i}: replay {r.get('sent')} req in {r.get('elapsed_s', 0):.1f} s; increase {r.get('increase', float('nan')):.1f}; "
              f"rate {r.get('rate', float('nan')):.3f}/s vs replay {r.get('replay_rps', float('nan')):.3f}/s; "
              f"predicted {r.get('predicted', float('nan')):.2%} delivered {r.get('delivered', float('nan')):.2%} "
              f"gap {r.get('gap_points', float('nan')):+.2f} pt (bound {r.get('bound', float('nan')):.2%}); "
              f"TTFB p99 {r.get('ttfb_p99_ms', float('nan')):.1f} ms; {r.get('dashboard_exprs')} dashboard exprs")
    for name, ok, detail in results:
        if not ok:
            print(f"  failed: {name}: {detail}")
    passed = sum(1 for _, ok, _ in results if ok)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"run exceeded {DEADLINE_S} s")))
    signal.alarm(DEADLINE_S)
    try:
        code = main()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print(f"ERROR: {type(e).__name__}: {e}", file=sys.stderr)
        code = 1
    finally:
        cleanup()
    sys.exit(code)
