#!/usr/bin/env bash
# Builds and runs head_capacity_probe.cpp (what the model's own last FFN could add to an exit head,
# untrained) against a Release build's libraries; prints the held-out agreements.
# Usage: bench/early_exit/run_head_capacity_probe.sh [MODEL] [EXIT] [TOKENS]
#   default: Qwen2.5-Coder-1.5B, exit 14, 8192 tokens of ShareGPT (scripts/fetch_sharegpt.sh) + GSM8K
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf}
EXIT=${2:-14}
TOKENS=${3:-8192}
SG=data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.first17671.json
GSM8K=../shared/data/intercept/gsm8k/test.jsonl
for f in "$MODEL" "$SG" "$GSM8K" build/libhelios_core.a; do
  [ -f "$f" ] || { echo "missing $f (scripts/setup.sh, scripts/fetch_model.sh qwen-pair, scripts/fetch_sharegpt.sh)" >&2; exit 1; }
done
BIN=$(mktemp -d)/head_capacity_probe
trap 'rm -rf "$(dirname "$BIN")"' EXIT
echo "== build" >&2
g++ -O2 -march=native -std=c++20 -Iinclude -I. bench/early_exit/head_capacity_probe.cpp build/libhelios_core.a \
  build/libhelios_kernels_ref.a -lopenblas -lyaml-cpp -lspdlog -lfmt -licuuc -lpthread -o "$BIN"
"$BIN" "$MODEL" "$EXIT" "$SG" "$GSM8K" --tokens "$TOKENS"
