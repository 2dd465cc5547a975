#!/usr/bin/env bash
# Q4_K layouts side by side (q4k_layout_bench.cpp): llama.cpp's row kernel against the CPU
# backend's 4 weight rows interleaved, single thread, on the matrix shapes of Qwen2.5-Coder-1.5B (K = 1536 in, 8960 and
# 1536 out; 8960 in for ffn_down) at 1, 8, 64 and 256 activation rows. Writes
# bench/results/q4k_layout_<time>.md. Run it on a quiet machine: it times the kernels themselves.
# Usage: bench/kernels/run_q4k_layout_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=$(mktemp -d)/q4k_layout_bench
trap 'rm -rf "$(dirname "$BIN")"' EXIT
echo "== build (g++ -O3 -march=native)" >&2
g++ -O3 -march=native -std=c++20 -I. bench/kernels/q4k_layout_bench.cpp kernels/ref/quant_matmul_k.cpp kernels/ref/quant_matmul_x4.cpp -o "$BIN"
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=bench/results/q4k_layout_$STAMP.md
{
  echo "<!-- command: bench/kernels/run_q4k_layout_bench.sh (commit $(git rev-parse --short HEAD); load average at start $(cut -d' ' -f1 /proc/loadavg)) -->"
  echo "# Q4_K layouts: the row kernel against 4 rows interleaved (single thread, best of 21)"
  echo
  echo "Error: the largest |result - exact| / max(1, |exact|) over 4 rows, exact = the blocks' integers in double."
  echo
  echo "| weights (out x in) | rows | row kernel ms | GMAC/s | interleaved ms | GMAC/s | speed-up | error row kernel | error interleaved |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for shape in "1536 8960" "1536 1536" "8960 1536"; do
    for rows in 1 8 64 256; do
      # shellcheck disable=SC2086
      "$BIN" $shape "$rows"
    done
  done
} | tee "$OUT"
echo "wrote $OUT" >&2
