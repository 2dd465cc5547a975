#!/usr/bin/env bash
# heliosd beside llama.cpp's llama-server, both through helios-bench's OpenAI backend: the same
# sampled ShareGPT first turns, the same arrival schedule, fixed output length, greedy, EOS
# ignored, 2 threads each, at each concurrency level. llama-server is built here from the vendor
# folder of the llama-cpp-python 0.3.36 sdist (PyPI) into a folder outside the repository; its
# code is never committed and never part of CI.
#
#   bench/openai/run_vs_llama_server.sh                          # SmolLM2, concurrency 1,8,32
#   MODEL=qwen-1.5b LEVELS=1,8 bench/openai/run_vs_llama_server.sh
#
# Environment: MODEL (smollm2 | qwen-0.5b | qwen-1.5b | a .gguf path), LEVELS (1,8,32),
# NUM_PROMPTS (64), OUTPUT_LEN (64), MAX_PROMPT_LEN (160 tokens, about 700 characters),
# THREADS (2), LLAMA_DIR (/tmp/llama-server-build: sdist and build), HELIOSD (build/heliosd).
# Results: bench/results/vs_llama_server_<model>_c<N>_<UTC date>.{json,md} from helios-bench.
#
# The CPU flags: the llama.cpp build turns on what this machine's CPU has (AVX2/FMA/F16C, and
# AVX-512/VNNI only when /proc/cpuinfo lists them), GGML_NATIVE and AMX off: AMX code crashes in
# these VMs, and an AVX-512 build dies with SIGILL on a CPU without it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
MODEL="${MODEL:-smollm2}"
case "$MODEL" in
  smollm2) model_path=models/SmolLM2-135M-Instruct.Q4_1.gguf; fetch=smollm2-135m ;;
  qwen-0.5b) model_path=models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf; fetch=qwen2.5-coder-0.5b ;;
  qwen-1.5b) model_path=models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf; fetch=qwen2.5-coder-1.5b ;;
  *.gguf) model_path="$MODEL"; fetch="" ;;
  *) echo "run_vs_llama_server: MODEL must be smollm2, qwen-0.5b, qwen-1.5b or a .gguf path" >&2; exit 2 ;;
esac
[ -f "$model_path" ] || { [ -n "$fetch" ] && scripts/fetch_model.sh "$fetch"; }
LEVELS="${LEVELS:-1,8,32}"
THREADS="${THREADS:-2}"
LLAMA_DIR="${LLAMA_DIR:-/tmp/llama-server-build}"
HELIOSD="${HELIOSD:-$root/build/heliosd}"
PY=/usr/bin/python3
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

# --- llama-server from the sdist
server_bin="$LLAMA_DIR/build/bin/llama-server"
if [ ! -x "$server_bin" ]; then
  mkdir -p "$LLAMA_DIR"
  src=$(ls -d "$LLAMA_DIR"/llama_cpp_python-0.3.36/vendor/llama.cpp 2>/dev/null || true)
  if [ -z "$src" ]; then
    step "downloading the llama-cpp-python 0.3.36 sdist"
    # From PyPI's simple index, checked against its sha256: `pip download --no-binary :all:` would
    # first build the sdist's build dependencies from source to read its metadata (many minutes).
    href=$(curl -sf https://pypi.org/simple/llama-cpp-python/ | grep -o 'href="[^"]*llama_cpp_python-0.3.36.tar.gz[^"]*"' | head -1)
    href=${href#href=\"}; href=${href%\"}
    [ -n "$href" ] || { echo "run_vs_llama_server: llama-cpp-python 0.3.36 not found on PyPI's simple index" >&2; exit 1; }
    curl -sfL -o "$LLAMA_DIR"/llama_cpp_python-0.3.36.tar.gz "${href%%#*}"
    (cd "$LLAMA_DIR" && echo "${href##*sha256=}  llama_cpp_python-0.3.36.tar.gz" | sha256sum -c --quiet) >&2
    tar -xzf "$LLAMA_DIR"/llama_cpp_python-0.3.36.tar.gz -C "$LLAMA_DIR"
    src="$LLAMA_DIR/llama_cpp_python-0.3.36/vendor/llama.cpp"
  fi
  has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
  step "building llama-server (AVX2 $(has avx2), AVX-512 $(has avx512f), VNNI $(has avx512_vnni))"
  cmake -S "$src" -B "$LLAMA_DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF \
        -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX=ON -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" \
        -DGGML_F16C="$(has f16c)" -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
  cmake --build "$LLAMA_DIR/build" -j "$(nproc)" --target llama-server >&2
fi

tmp=$(mktemp -d)
cleanup() { [ -n "${llama_pid:-}" ] && kill "$llama_pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cat > "$tmp/heliosd.yaml" <<YAML
server:
  listen: 127.0.0.1:0
  metrics_listen: ""
models:
  - name: model
    path: $root/$model_path
engine:
  threads: $THREADS
  kv_cache: 512MiB
YAML
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Each level gets a fresh llama-server, as helios-bench starts a fresh heliosd for each: a server
# kept across levels would serve the repeated prompts from the slot caches of the level before.
start_llama_server() {
  step "starting llama-server on :$port ($1 slots)"
  "$server_bin" -m "$root/$model_path" -t "$THREADS" -tb "$THREADS" --host 127.0.0.1 --port "$port" \
    --alias model -np "$1" -c $(($1 * 512)) --no-webui > "$tmp/llama.log" 2>&1 &
  llama_pid=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "run_vs_llama_server: llama-server did not come up; its log:" >&2; cat "$tmp/llama.log" >&2; exit 1
}
stop_llama_server() { kill "$llama_pid" 2>/dev/null || true; wait "$llama_pid" 2>/dev/null || true; llama_pid=; }
for c in ${LEVELS//,/ }; do
  start_llama_server "$c"
  step "concurrency $c"
  HELIOSD="$HELIOSD" "$PY" -m bench.helios_bench --backend openai --config "$tmp/heliosd.yaml" \
    --url "http://127.0.0.1:$port" --label heliosd --label llama-server --model model \
    --dataset prompts --num-prompts "${NUM_PROMPTS:-64}" --output-len "${OUTPUT_LEN:-64}" \
    --max-prompt-len "${MAX_PROMPT_LEN:-160}" --request-rate inf --max-concurrency "$c" --no-progress \
    --result-name "vs_llama_server_$(basename "$model_path" .gguf)_c${c}_$(date -u +%Y-%m-%dT%H%MZ)"
  stop_llama_server
done
