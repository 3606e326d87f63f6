#!/usr/bin/env bash
# llama.cpp's `llama-server`, built on the CPU from the source the llama-cpp-python sdist
# ships (vendor/llama.cpp), and a tiny model for it (tiny_gguf.py: random weights, a real
# tokenizer). Everything is cached under DIR: a second run does nothing.
# Usage: benches/real_engine/build.sh DIR TOKENIZER_DIR   (prints the server and the model)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
tokenizer="$(cd "$2" && pwd)"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
server="$src/build/bin/llama-server"
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
need() { command -v "$1" >/dev/null 2>&1 || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends "$2" >&2; }; }
need cmake cmake
need c++ g++
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  $sudo apt-get install -y --no-install-recommends python3-venv >&2
fi
if [ ! -x "$dir/venv/bin/python" ]; then
  python3 -m venv "$dir/venv"
  timeout 600 "$dir/venv/bin/pip" install --quiet --disable-pip-version-check numpy pyyaml >&2
fi
if [ ! -d "$src" ]; then
  timeout 900 "$dir/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --no-binary :all: "llama-cpp-python==$version" -d "$dir" >&2
  tar -xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
if [ ! -x "$server" ]; then
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON >&2
  cmake --build "$src/build" --target llama-server -j "$(nproc)" >&2
fi
model="$dir/tiny-$(basename "$tokenizer").gguf"
if [ ! -s "$model" ]; then
  PYTHONPATH="$src/gguf-py" "$dir/venv/bin/python" "$here/tiny_gguf.py" "$tokenizer" "$model" >&2
fi
echo "$server"
echo "$model"
