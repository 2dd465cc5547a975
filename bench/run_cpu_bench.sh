#!/usr/bin/env bash
# The CPU engine benchmark in one command: Helios and llama.cpp side by side at batch 1, same
# file, same threads, same prompt token ids, for each model, prompt depth and KV cache type:
# prefill tok/s, decode tok/s and the memory bandwidth decode achieves.
# Writes bench/results/cpu_engine_<date>.{json,md}.
#
# usage: bench/run_cpu_bench.sh [--models LIST] [--depths LIST] [--kv-types LIST] [--threads N]
#                               [--decode-tokens N] [--repeats N] [--warmup N] [--bandwidth-gbs X]
#   --models     comma list of: smollm2 (default), qwen-0.5b, qwen-1.5b, synthetic-1b
#                (the Qwen files come from scripts/fetch_model.sh qwen-pair; synthetic-1b is made)
#   --depths     prompt lengths, each one forward pass before decode (default 128)
#   --kv-types   f16 (both engines' default) and/or f32 (default f16,f32)
#   --bandwidth-gbs  the machine's memory read bandwidth, for decode's share of it (default 30:
#                what this VM kind reads with 2 threads)
# env:   PYTHON  Python with llama-cpp-python (default /opt/golden-venv/bin/python, else python3)
#        BUILD_DIR  CMake build folder (default build)
set -euo pipefail

cd "$(dirname "$0")/.."
command_line="bench/run_cpu_bench.sh${*:+ $*}"
threads=$(nproc)
models=smollm2
depths=128
kv_types=f16,f32
decode_tokens=64
repeats=3
warmup=1
bandwidth=30
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --depths) depths="$2"; shift 2 ;;
    --kv-types) kv_types="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --decode-tokens) decode_tokens="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --bandwidth-gbs) bandwidth="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_cpu_bench: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

BUILD_DIR="${BUILD_DIR:-build}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/golden-venv/bin/python ]; then PYTHON=/opt/golden-venv/bin/python; else PYTHON=python3; fi
fi
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
model_file() {
  case "$1" in
    smollm2) echo models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
    qwen-0.5b) echo models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf ;;
    qwen-1.5b) echo models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf ;;
    synthetic-1b) echo models/synthetic-1b-q4_1.gguf ;;
    *) echo "run_cpu_bench: unknown model '$1' (smollm2, qwen-0.5b, qwen-1.5b, synthetic-1b)" >&2; exit 2 ;;
  esac
}
prompts=../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json
[ -f "$prompts" ] || prompts=tests/data/sharegpt/ShareGPT_V3_filtered_first80_prompts.json

# --- check the prerequisites before spending minutes
if ! "$PYTHON" -c 'import llama_cpp, numpy' 2>/dev/null; then
  echo "run_cpu_bench: $PYTHON cannot import llama_cpp (llama-cpp-python), which measures llama.cpp." >&2
  echo "  python3 -m venv .venv && .venv/bin/pip install llama-cpp-python gguf numpy" >&2
  echo "  PYTHON=.venv/bin/python bench/run_cpu_bench.sh" >&2
  exit 1
fi
for m in ${models//,/ }; do
  f=$(model_file "$m")
  if [ "$m" != synthetic-1b ] && [ ! -f "$f" ]; then
    fetch=smollm2; [ "$m" = smollm2 ] || fetch=qwen-pair
    echo "run_cpu_bench: $f is missing; fetch it with scripts/fetch_model.sh $fetch" >&2
    exit 1
  fi
done

# --- build (configuring again is quick and makes sure the bench target exists)
step "building helios-bench-engine in $BUILD_DIR"
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" > /dev/null
else
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
[ "$build_type" = Release ] || echo "run_cpu_bench: warning: $BUILD_DIR is a '$build_type' build, not Release" >&2
cmake --build "$BUILD_DIR" --target helios-bench-engine -j "$(nproc)" > /dev/null
if [[ ",$models," == *,synthetic-1b,* ]] && [ ! -f models/synthetic-1b-q4_1.gguf ]; then
  step "making models/synthetic-1b-q4_1.gguf (about 650 MB)"
  cmake --build "$BUILD_DIR" --target helios -j "$(nproc)" > /dev/null
  "$BUILD_DIR/helios" make-synthetic --preset 1b --type Q4_1 --out models/synthetic-1b-q4_1.gguf
fi

# --- run: per model and depth, each KV type on Helios then on llama.cpp (same prompt ids)
date_tag=$(date -u +%Y-%m-%dT%H%MZ)
mkdir -p bench/results
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
runs=()
for m in ${models//,/ }; do
  model=$(model_file "$m")
  for depth in ${depths//,/ }; do
    for kv in ${kv_types//,/ }; do
      label="$m@$depth/$kv"
      tag="$m-$depth-$kv"
      step "$label: Helios ($threads threads, KV $kv)"
      "$BUILD_DIR/bench/helios-bench-engine" --model "$model" --threads "$threads" \
          --prompt-tokens "$depth" --decode-tokens "$decode_tokens" --repeats "$repeats" \
          --warmup "$warmup" --kv-type "$kv" --prompts "$prompts" --json "$work/$tag.helios.json"
      step "$label: llama.cpp ($threads threads, KV $kv, same prompt ids)"
      "$PYTHON" bench/llama_cpp_bench.py --helios-json "$work/$tag.helios.json" \
          --kv-types "${kv^^}" --json "$work/$tag.llama_cpp.json"
      runs+=("$label" "$work/$tag.helios.json" "$work/$tag.llama_cpp.json")
    done
  done
done

step "writing bench/results/cpu_engine_$date_tag.{json,md}"
python3 bench/cpu_bench_report.py --command "$command_line" --date "$date_tag" \
    --bandwidth-gbs "$bandwidth" --out-json "bench/results/cpu_engine_$date_tag.json" \
    --out-md "bench/results/cpu_engine_$date_tag.md" "${runs[@]}"
