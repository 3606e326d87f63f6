#!/usr/bin/env bash
# Makes DIR/venv with the packages of REQUIREMENTS unless it is there, installing Debian's
# python3-venv first if need be. Callers hold their own lock. Usage: tests/venv.sh DIR REQUIREMENTS
set -euo pipefail
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends python3-venv >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends python3-venv >&2; }
fi
if [ ! -e "$1/venv/.installed" ]; then # not there, or an install that did not finish
  rm -rf "$1/venv"
  python3 -m venv "$1/venv"
  timeout 600 "$1/venv/bin/pip" install --quiet --disable-pip-version-check -r "$2" >&2
  touch "$1/venv/.installed"
fi
