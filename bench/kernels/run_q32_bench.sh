#!/usr/bin/env bash
# The 32-value quantized matmuls (q32_bench.cpp) built twice from the same source, with this
# CPU's AVX-512 and without it (-mno-avx512f: the 256-bit tiles), side by side, single thread, on
# the shapes of SmolLM2-135M (Q4_1) and Qwen2.5-Coder-0.5B (Q5_0, and Q8_0 for attn_v and the LM
# head) at 1, 8, 32 and 64 activation rows. Every result is checked bit for bit against the scalar
# reference ("differ" counts mismatches: 0). Writes bench/results/q32_avx512_<time>.md.
# Run it on a quiet machine: it times the kernels themselves.
# Usage: bench/kernels/run_q32_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qw avx512f /proc/cpuinfo || { echo "run_q32_bench: this CPU has no AVX-512: nothing to compare" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
src=(bench/kernels/q32_bench.cpp kernels/ref/quant_matmul.cpp kernels/ref/quant_matmul_k.cpp kernels/ref/quant_matmul_x4.cpp)
echo "== build (g++ -O3 -march=native, and the same with -mno-avx512f)" >&2
g++ -O3 -march=native -std=c++20 -I. "${src[@]}" -o "$dir/wide"
g++ -O3 -march=native -mno-avx512f -std=c++20 -I. "${src[@]}" -o "$dir/narrow"
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=bench/results/q32_avx512_$STAMP.md
rows=(1 8 32 64)
shapes=("q4_1 576 1536" "q4_1 1536 576" "q4_1 576 576" "q5_0 896 4864" "q5_0 896 896" "q8_0 896 128" "q8_0 896 151936")
{
  echo "<!-- command: bench/kernels/run_q32_bench.sh (commit $(git rev-parse --short HEAD); load average at start $(cut -d' ' -f1 /proc/loadavg)) -->"
  echo "# 32-value quantized matmuls: 256-bit tiles against AVX-512 paired tiles (single thread, best of 21, each build run 3 times alternately)"
  echo
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs). \"differ\": results not bit-identical to the scalar reference."
  echo
  echo "The 256-bit build is \`-mno-avx512f\`: AVX2 code, whose byte products take \`maddubs\` + \`madd\` (VNNI's \`dpbusd\` needs AVX-512VL here). The AVX-512 build runs the same 256-bit tiles with \`dpbusd\` below 16 rows and the paired 512-bit tiles from 16 (\`kPairedMinRows\`); at 1–2 rows both stream the blocks as they are."
  echo
  echo "| type | weights (out x in) | rows | 256-bit ms | GMAC/s | AVX-512 ms | GMAC/s | speed-up | differ |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for shape in "${shapes[@]}"; do
    # shellcheck disable=SC2086
    set -- $shape
    for r in "${rows[@]}"; do
      n_runs="" w_runs=""
      for _ in 1 2 3; do  # alternately, so that a busy machine slows both builds alike
        n_runs+="$("$dir/narrow" "$1" "$2" "$3" "$r")"$'\n'
        w_runs+="$("$dir/wide" "$1" "$2" "$3" "$r")"$'\n'
      done
      n=$(sort -k5 -g <<<"${n_runs%$'\n'}" | head -1); w=$(sort -k5 -g <<<"${w_runs%$'\n'}" | head -1)
      read -r t o i _ nms ng nd <<<"$n"
      read -r _ _ _ _ wms wg wd <<<"$w"
      printf '| %s | %s x %s | %s | %s | %s | %s | %s | **%.2fx** | %s |\n' "$t" "$o" "$i" "$r" "$nms" "$ng" "$wms" "$wg" \
        "$(awk -v a="$wg" -v b="$ng" 'BEGIN { print a / b }')" "$((nd + wd))"
    done
  done
} | tee "$OUT"
echo "wrote $OUT" >&2
