#!/usr/bin/env bash
# Compile llama.cpp's CUDA backend with NVIDIA's PyPI toolchain (no system toolkit, no GPU
# needed) through the README's build step, then start `serve` on it: on a machine without a GPU
# it must run on the CPU and say why in one line; on one with a GPU, use it.
#
#   scripts/check_cuda_build.sh [VENV]    # default VENV: ~/.cache/gpt-oss-server/cuda-check-venv
#   CUDA_ARCH=89-real (default; one architecture keeps the build short)
#
# Too long for CI (a fresh 2-core machine already builds llama.cpp twice there): run it before
# changing scripts/install_llama_cpp.py, server/ops/accelerator.py or the start-up check. The
# wheel is cached per (version, flags), so a second run only reinstalls. devkit/notes/gpu-runbook.md
# has a complete run's time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt-oss-server/cuda-check-venv}
arch=${CUDA_ARCH:-89-real}
port=${PORT:-8097}
started=$(date +%s)

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" scripts/install_llama_cpp.py --backend cuda --cuda-arch "$arch"
"$venv/bin/pip" install -q .
echo "build and install: $(( $(date +%s) - started )) s"

# The built library finds the CUDA runtime wheels beside it (its RUNPATH), no LD_LIBRARY_PATH.
"$venv/bin/python" - <<'EOF'
import pathlib, subprocess, llama_cpp
cuda = next((pathlib.Path(llama_cpp.__file__).parent / "lib").glob("libggml-cuda.so*"))
print(subprocess.run(["readelf", "-d", str(cuda)], capture_output=True, text=True).stdout
      .split("RUNPATH")[1].splitlines()[0].strip(" )"))
EOF
"$venv/bin/gpt-oss-server" doctor

model=$("$venv/bin/python" -c "from server.testing.synthetic_gguf import cached_gguf; print(cached_gguf())")
log=$(mktemp)
"$venv/bin/gpt-oss-server" serve --model "$model" --port "$port" --n-ctx 4096 --no-prompt-cache \
    >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$log"; echo "serve exited"; exit 1; }
    sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log"; echo "no /health"; exit 1; }
curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}' >/dev/null
kill "$server"
wait "$server" || true
grep -v "^\s*$" "$log" | grep -E "CUDA|GPU|placement|ready" || true
grep -qE "this llama-cpp-python build has CUDA|GPUs: CUDA" "$log" ||
    { cat "$log"; echo "serve did not say what became of CUDA"; exit 1; }
echo "check_cuda_build: ok in $(( $(date +%s) - started )) s"
