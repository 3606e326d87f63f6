#!/usr/bin/env bash
# Conformance of the router with the official openai and anthropic Python SDKs (see
# test_openai_sdk.py and test_anthropic_sdk.py).
# Usage: tests/sdk/run.sh [ROUTER_BINARY]   (else $PREFIX_ROUTER, else target/debug/prefix-router)
# VENV: virtualenv directory (default: target/sdk-venv under the repo root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
VENV="${VENV:-$root/target/sdk-venv}"
ROUTER="${1:-${PREFIX_ROUTER:-$root/target/debug/prefix-router}}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

apt_install() {  # Debian packages, only those missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" \
    || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }
}

PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_install python3 python3-venv
  PY="$(command -v python3)"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.requirements-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  timeout 600 "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
status=0
timeout 300 "$VENV/bin/python" -B "$here/test_openai_sdk.py" "$ROUTER" || status=1
timeout 300 "$VENV/bin/python" -B "$here/test_anthropic_sdk.py" "$ROUTER" || status=1
exit $status
