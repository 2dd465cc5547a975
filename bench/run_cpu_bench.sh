#!/usr/bin/env bash
# The CPU engine benchmark in one command: Helios and llama.cpp, prefill and decode at batch 1,
# on SmolLM2-135M (Q4_1) and a synthetic 1B-shaped model (Q4_1), same file, same threads, same
# prompt, side by side. Writes bench/results/cpu_engine_<date>.{json,md}.
#
# usage: bench/run_cpu_bench.sh [--threads N] [--prompt-tokens N] [--decode-tokens N] [--repeats N]
# env:   PYTHON  Python with llama-cpp-python (default /opt/golden-venv/bin/python, else python3)
#        BUILD_DIR  CMake build folder (default build)
set -euo pipefail

cd "$(dirname "$0")/.."
command_line="bench/run_cpu_bench.sh${*:+ $*}"
threads=$(nproc)
prompt_tokens=128
decode_tokens=64
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --prompt-tokens) prompt_tokens="$2"; shift 2 ;;
    --decode-tokens) decode_tokens="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_cpu_bench: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

BUILD_DIR="${BUILD_DIR:-build}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/golden-venv/bin/python ]; then PYTHON=/opt/golden-venv/bin/python; else PYTHON=python3; fi
fi
smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf
synthetic=models/synthetic-1b-q4_1.gguf
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

# --- check the prerequisites before spending minutes
if ! "$PYTHON" -c 'import llama_cpp, numpy' 2>/dev/null; then
  echo "run_cpu_bench: $PYTHON cannot import llama_cpp (llama-cpp-python), which measures llama.cpp." >&2
  echo "  python3 -m venv .venv && .venv/bin/pip install llama-cpp-python gguf numpy" >&2
  echo "  PYTHON=.venv/bin/python bench/run_cpu_bench.sh" >&2
  exit 1
fi
if [ ! -f "$smollm2" ]; then
  echo "run_cpu_bench: $smollm2 is missing; fetch it with scripts/fetch_model.sh" >&2
  exit 1
fi

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

if [ ! -f "$synthetic" ]; then
  step "making $synthetic (about 650 MB)"
  cmake --build "$BUILD_DIR" --target helios -j "$(nproc)" > /dev/null
  "$BUILD_DIR/helios" make-synthetic --preset 1b --type Q4_1 --out "$synthetic"
fi

# --- run
date_tag=$(date -u +%Y-%m-%dT%H%MZ)
mkdir -p bench/results
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
runs=()
for entry in "smollm2-135m:$smollm2" "synthetic-1b:$synthetic"; do
  label="${entry%%:*}"
  model="${entry#*:}"
  step "$label: Helios ($threads threads)"
  "$BUILD_DIR/bench/helios-bench-engine" --model "$model" --threads "$threads" \
      --prompt-tokens "$prompt_tokens" --decode-tokens "$decode_tokens" --repeats "$repeats" \
      --json "$work/$label.helios.json"
  step "$label: llama.cpp ($threads threads, same prompt ids)"
  "$PYTHON" bench/llama_cpp_bench.py --helios-json "$work/$label.helios.json" \
      --json "$work/$label.llama_cpp.json"
  runs+=("$label" "$work/$label.helios.json" "$work/$label.llama_cpp.json")
done

step "writing bench/results/cpu_engine_$date_tag.{json,md}"
python3 bench/cpu_bench_report.py --command "$command_line" --date "$date_tag" \
    --out-json "bench/results/cpu_engine_$date_tag.json" \
    --out-md "bench/results/cpu_engine_$date_tag.md" "${runs[@]}"
