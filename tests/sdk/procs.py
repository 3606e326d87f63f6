"""Process and port helpers shared by the SDK conformance test: free loopback ports, child
processes in their own process group (killed on exit, also on failure or a signal), and
polling for readiness with a deadline."""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

_children = []


def free_port():
    """A port that was free a moment ago: bind port 0 on loopback, read it, release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port():
    """A loopback port nothing listens on (bound and released: connecting is refused)."""
    return free_port()


def spawn(args, log_path):
    """Starts `args` in a new process group, output to `log_path`; killed by cleanup()."""
    log = open(log_path, "wb")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    p.log_path = log_path
    p._log = log
    _children.append(p)
    return p


def stop(p, timeout=5.0):
    """SIGTERM to the child's process group, SIGKILL after `timeout` s."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)
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


def tail(p, n=20):
    try:
        with open(p.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
    except OSError:
        return "(no log)"


def http_get(url, timeout=2.0):
    """(status, body bytes) of a GET, or (None, error text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError) as e:
        return None, str(e)


def wait_until(what, cond, deadline_s, procs=()):
    """Polls `cond()` every 0.1 s until true; raises naming `what` after `deadline_s`, or as
    soon as one of `procs` has exited."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: process {p.args[:2]} exited with {p.returncode}:\n{tail(p)}")
        if cond():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not reached within {deadline_s} s")


def start_sim(binary, workdir, name, time_scale=50):
    port = free_port()
    p = spawn([binary, "sim", "--count", "1", "--base-port", str(port), "--time-scale", str(time_scale),
               "--name", name], os.path.join(workdir, f"sim-{port}.log"))
    url = f"http://127.0.0.1:{port}"
    wait_until(f"sim on {url} healthy", lambda: http_get(url + "/health")[0] == 200, 15, [p])
    p.url = url
    p.instance = f"{name}-{port}"
    return p


def start_router(binary, workdir, worker_urls, extra=(), wait_healthy=True):
    port, admin = free_port(), free_port()
    tag = f"router-{port}"
    p = spawn([binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin),
               "--worker-urls", ",".join(worker_urls), "--health-check-interval", "1",
               "--upgrade-socket", os.path.join(workdir, f"{tag}.sock"), *extra],
              os.path.join(workdir, f"{tag}.log"))
    p.url = f"http://127.0.0.1:{port}"
    p.admin = f"http://127.0.0.1:{admin}"
    wait_until(f"router {p.url} admin up", lambda: http_get(p.admin + "/workers")[0] == 200, 15, [p])
    if wait_healthy:
        wait_router_healthy(p)
    return p


def workers(router):
    status, body = http_get(router.admin + "/workers")
    return json.loads(body)["workers"] if status == 200 else []


def wait_router_healthy(router, deadline_s=15):
    def ok():
        w = workers(router)
        return bool(w) and all(x.get("healthy") and x.get("ready") for x in w)
    wait_until(f"all backends of {router.url} healthy", ok, deadline_s, [router])


def metrics(router):
    """The admin /metrics as {(name, frozenset(labels)): value}."""
    status, body = http_get(router.admin + "/metrics")
    out = {}
    if status != 200:
        return out
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = []
        for item in filter(None, labels.rstrip("}").split(",")):
            k, _, v = item.partition("=")
            pairs.append((k, v.strip('"')))
        out[(name, frozenset(pairs))] = float(value)
    return out


def metric_sum(m, name, **labels):
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= set(ls))
