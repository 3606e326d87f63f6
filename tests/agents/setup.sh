#!/usr/bin/env bash
# Installs the three coding-agent CLIs that tests/agents drives, at pinned versions, into
# target/agents (npm's --prefix), unless they are already there at those versions. Prints the
# directory holding their commands (claude, codex, opencode) on stdout; everything else goes
# to stderr. Safe to run concurrently (flock) and again (idempotent). Usage: tests/agents/setup.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR="$ROOT/target/agents"
# package@version and the command it provides
PKGS=(
  "@anthropic-ai/claude-code@2.1.332 claude"
  "@openai/codex@0.169.1 codex"
  "opencode-ai@1.18.33 opencode"
)
if ! command -v npm >/dev/null; then
  echo "setup.sh: installing Debian's nodejs and npm" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y nodejs npm >&2 || { $SUDO apt-get update >&2 && $SUDO apt-get install -y nodejs npm >&2; }
fi
command -v npm >/dev/null || { echo "setup.sh: npm is missing" >&2; exit 1; }
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9

installed() { # PKG VERSION: true when node_modules has PKG at VERSION
  local pj="$DIR/node_modules/$1/package.json"
  [ -f "$pj" ] && [ "$(node -p "require(process.argv[1]).version" "$pj" 2>/dev/null)" = "$2" ]
}

missing=()
for entry in "${PKGS[@]}"; do
  spec=${entry%% *}; name=${spec%@*}; ver=${spec##*@}
  installed "$name" "$ver" || missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]} into $DIR" >&2
  # all three in one call, so package.json and the lock list every one
  all=(); for entry in "${PKGS[@]}"; do all+=("${entry%% *}"); done
  timeout 900 npm install --prefix "$DIR" --no-audit --no-fund --save-exact --loglevel=error "${all[@]}" >&2
  for entry in "${PKGS[@]}"; do
    spec=${entry%% *}; name=${spec%@*}; ver=${spec##*@}
    installed "$name" "$ver" || { echo "setup.sh: $spec did not install" >&2; exit 1; }
  done
fi
# each command must exist and start (the native binaries come from per-platform optional deps)
for entry in "${PKGS[@]}"; do
  bin=${entry##* }
  [ -x "$DIR/node_modules/.bin/$bin" ] || { echo "setup.sh: $DIR/node_modules/.bin/$bin missing" >&2; exit 1; }
  out=$(HOME="$DIR/.probe-home" timeout 60 "$DIR/node_modules/.bin/$bin" --version 2>&1) \
    || { echo "setup.sh: '$bin --version' failed: $out" >&2; exit 1; }
  echo "setup.sh: $bin $out" >&2
done
rm -rf "$DIR/.probe-home"
echo "$DIR/node_modules/.bin"
