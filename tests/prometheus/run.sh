#!/usr/bin/env bash
# A real Prometheus scraping the router while a replay runs (see test_prometheus.py).
# Usage: tests/prometheus/run.sh [ROUTER_BINARY] [test_prometheus.py options, e.g. --workload conversation --runs 3]
#   ROUTER_BINARY else $PREFIX_ROUTER, else target/debug/prefix-router.
# VENV: virtualenv directory (default: target/prom-venv under the repo root).
# PROMETHEUS_VERSION: Debian version of `prometheus` to install if missing (default below;
#   if Debian no longer has it, the current one is installed with a warning).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
VENV="${VENV:-$root/target/prom-venv}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-2.42.0+ds-5+deb12u1}"
ROUTER="${PREFIX_ROUTER:-$root/target/debug/prefix-router}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then ROUTER="$1"; shift; fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

apt_get() { $SUDO apt-get install -y --no-install-recommends "$@" || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "$@"; }; }

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "installing Debian package prometheus=$PROMETHEUS_VERSION"
  apt_get "prometheus=$PROMETHEUS_VERSION" || {
    echo "WARNING: prometheus=$PROMETHEUS_VERSION not available, installing the current candidate"; apt_get prometheus; }
fi
PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_get python3 python3-venv
  PY="$(command -v python3)"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.requirements-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  timeout 600 "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
exec timeout 900 "$VENV/bin/python" -B "$here/test_prometheus.py" "$ROUTER" "$@"
