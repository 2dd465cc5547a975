#!/usr/bin/env bash
# K-quant layouts side by side (kquant_layout_bench.cpp): llama.cpp's row kernels against the CPU
# backend's 4 weight rows interleaved, for Q4_K and Q6_K, single thread, on the matrix shapes of
# Qwen2.5-Coder-1.5B (K = 1536 in, 8960 and 1536 out; 8960 in for ffn_down; 151936 out for the
# Q6_K LM head) at 1, 8, 64 and 256 activation rows. Writes bench/results/kquant_layout_<time>.md. Run it on a quiet machine: it times the kernels themselves.
# Usage: bench/kernels/run_kquant_layout_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=$(mktemp -d)/kquant_layout_bench
trap 'rm -rf "$(dirname "$BIN")"' EXIT
echo "== build (g++ -O3 -march=native)" >&2
g++ -O3 -march=native -std=c++20 -I. bench/kernels/kquant_layout_bench.cpp kernels/ref/quant_matmul_k.cpp kernels/ref/quant_matmul_x4.cpp -o "$BIN"
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=bench/results/kquant_layout_$STAMP.md
{
  echo "<!-- command: bench/kernels/run_kquant_layout_bench.sh (commit $(git rev-parse --short HEAD); load average at start $(cut -d' ' -f1 /proc/loadavg)) -->"
  echo "# K-quant layouts: the row kernels against 4 rows interleaved (single thread, best of 21)"
  echo
  echo "Error: the largest |result - exact| / max(1, |exact|) over 4 rows, exact = the blocks' integers in double."
  echo
  echo "| type | weights (out x in) | rows | row kernel ms | GMAC/s | interleaved ms | GMAC/s | speed-up | error row kernel | error interleaved |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for type in q4_k q6_k; do
    shapes=("1536 8960" "1536 1536" "8960 1536")
    [ "$type" = q6_k ] && shapes+=("1536 151936")
    for shape in "${shapes[@]}"; do
      for rows in 1 8 64; do
        # shellcheck disable=SC2086
        "$BIN" $shape "$rows" "$type"
      done
    done
  done
} | tee "$OUT"
echo "wrote $OUT" >&2
