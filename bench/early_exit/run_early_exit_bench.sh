#!/usr/bin/env bash
# Early exit on SmolLM2-135M, CPU: what each policy and threshold buys in serving throughput and
# costs in quality, side by side in one run.
#   1. exit heads: `helios calibrate` on ShareGPT-90k first prompts (once; kept next to the model);
#   2. throughput: helios-bench in compare mode — one heliosd per policy, the same ShareGPT prompts
#      (mlenergy ShareGPT V3) at the same fixed concurrency, `full` first, ratios against it;
#   3. quality: `helios eval` on held-out ShareGPT V3 text — perplexity increase and greedy token
#      agreement with `full`, per policy and threshold;
#      `full` runs again last (full-repeat), so the report states the run-to-run noise;
#   4. bench/early_exit/pareto_report.py merges both into bench/results/early_exit_<time>.{md,json}
#      and a Pareto plot (speed-up vs perplexity increase).
# Usage: bench/early_exit/run_early_exit_bench.sh [--quick]
#   env: NUM_PROMPTS (48), CONCURRENCY (8), OUTPUT_LEN (64), THRESHOLDS ("0.8 0.9 0.95 calibrated"),
#        PROBE_THRESHOLDS ("0.8 0.9")
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
NUM_PROMPTS=${NUM_PROMPTS:-48}
CONCURRENCY=${CONCURRENCY:-8}
OUTPUT_LEN=${OUTPUT_LEN:-64}
THRESHOLDS=${THRESHOLDS:-"0.8 0.9 0.95 calibrated"}
PROBE_THRESHOLDS=${PROBE_THRESHOLDS:-"0.8 0.9"}
EVAL_TOKENS=4096
if [ "${1:-}" = "--quick" ]; then NUM_PROMPTS=8; THRESHOLDS="0.8 calibrated"; PROBE_THRESHOLDS="0.8"; EVAL_TOKENS=512; fi

MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
HEADS=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.exits.gguf
EXITS="4,8,12,16,20,24,28"
# Calibration and evaluation text: ShareGPT prompts from the data folder beside the repository,
# or any ShareGPT JSON given as CAL_TEXT / EVAL_TEXT.
CAL_TEXT=${CAL_TEXT:-$ROOT/../shared/data/sharegpt/mlenergy_sg90k_first_prompts_2978_sorted.json}
EVAL_TEXT=${EVAL_TEXT:-$ROOT/../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json}
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=$ROOT/bench/results
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

[ -f "$MODEL" ] || { echo "missing $MODEL: run scripts/fetch_model.sh" >&2; exit 1; }
for f in "$CAL_TEXT" "$EVAL_TEXT"; do
  [ -f "$f" ] || { echo "missing $f: set CAL_TEXT and EVAL_TEXT to ShareGPT JSON files (scripts/fetch_sharegpt.sh installs one)" >&2; exit 1; }
done
echo "== build" >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)" --target helios heliosd > /dev/null

if [ ! -f "$HEADS" ]; then
  echo "== calibrate exit heads (once): $HEADS" >&2
  build/helios calibrate --model "$MODEL" --text "$CAL_TEXT" --exits "$EXITS" --max-tokens 16384 --out "$HEADS"
fi

# One config per policy point: label, policy, threshold, depth, measure, load_layers.
POINTS="full full 0.9 0 top1 0"
for t in $THRESHOLDS; do POINTS="$POINTS
per-token-top1-$t per-token $t 0 top1 0"; done
for t in $PROBE_THRESHOLDS; do POINTS="$POINTS
per-token-probe-$t per-token $t 0 probe 0"; done
POINTS="$POINTS
batch-sync-top1-0.9 batch-sync 0.9 0 top1 0
fixed-depth-24 fixed-depth 0 0 top1 24
fixed-depth-20 fixed-depth 0 0 top1 20
self-speculative-16 self-speculative 0.9 16 top1 0
full-repeat full 0.9 0 top1 0"  # full again, last: the run-to-run noise of the serving figures

configs=()  # the file name is the point's label
while read -r label policy threshold depth measure load; do
  [ -n "$label" ] || continue
  cat > "$WORK/$label.yaml" <<YAML
server:
  listen: 127.0.0.1:0
  metrics_listen: ""
models:
  - name: smollm2
    path: $MODEL
    early_exit:
      policy: $policy
      measure: $measure
      threshold: $([ "$threshold" = calibrated ] && echo 0.9 || echo "$threshold")
      calibrated_thresholds: $([ "$threshold" = calibrated ] && echo true || echo false)
      depth: $depth
      exits: [$EXITS]
      heads: $HEADS
      load_layers: $load
engine:
  threads: 0
  kv_cache: 1GiB
logging:
  level: warn
YAML
  configs+=(--config "$WORK/$label.yaml")
done <<< "$POINTS"

echo "== throughput: helios-bench, $(( ${#configs[@]} / 2 )) servers, $NUM_PROMPTS prompts at concurrency $CONCURRENCY" >&2
bench/helios-bench "${configs[@]}" \
  --dataset prompts --dataset-path "$EVAL_TEXT" --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
  --max-concurrency "$CONCURRENCY" --result-dir "$WORK" --result-name serving --no-plots

echo "== quality: helios eval on held-out ShareGPT text" >&2
build/helios eval --model "$MODEL" --heads "$HEADS" --exits "$EXITS" --text "$EVAL_TEXT" \
  --policy per-token --threshold "$(echo $THRESHOLDS | tr ' ' ',')" --max-tokens "$EVAL_TOKENS" \
  --json "$WORK/eval_top1.json" > /dev/null
build/helios eval --model "$MODEL" --heads "$HEADS" --exits "$EXITS" --text "$EVAL_TEXT" \
  --policy per-token --measure probe --threshold "$(echo $PROBE_THRESHOLDS | tr ' ' ',')" --max-tokens "$EVAL_TOKENS" \
  --json "$WORK/eval_probe.json" > /dev/null
build/helios eval --model "$MODEL" --heads "$HEADS" --exits "$EXITS" --text "$EVAL_TEXT" \
  --policy batch-sync --threshold 0.9 --max-tokens "$EVAL_TOKENS" --json "$WORK/eval_sync.json" > /dev/null
for d in 24 20; do
  build/helios eval --model "$MODEL" --heads "$HEADS" --exits "$EXITS" --text "$EVAL_TEXT" \
    --policy fixed-depth --depth "$d" --max-tokens "$EVAL_TOKENS" --json "$WORK/eval_fixed$d.json" > /dev/null
done
build/helios eval --model "$MODEL" --heads "$HEADS" --exits "$EXITS" --text "$EVAL_TEXT" \
  --policy self-speculative --depth 16 --max-tokens "$EVAL_TOKENS" --json "$WORK/eval_spec.json" > /dev/null

COMMAND="bench/early_exit/run_early_exit_bench.sh $*"
/usr/bin/python3 bench/early_exit/pareto_report.py --serving "$WORK/serving.json" --eval "$WORK"/eval_*.json \
  --command "$COMMAND" --out "$OUT/early_exit_$STAMP"
