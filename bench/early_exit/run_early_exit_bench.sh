#!/usr/bin/env bash
# Early exit on the CPU, per model: what each policy buys in serving throughput and costs in
# quality, with each kind of exit head, side by side in one run.
#   1. exit heads, once per model and kind, kept in models/: `helios calibrate --head lens|ridge|distilled`
#      on ShareGPT conversations (with replies, where scripts/fetch_sharegpt.sh has run) + GSM8K; lens heads are the identity with their
#      fitted agreement curve, so every kind serves the calibrated `agreement` measure;
#   2. evaluation text: ShareGPT V3, less every conversation whose prompt is in the calibration text
#      (split_text.py; the counts go into the report);
#   3. throughput: helios-bench compare mode, one heliosd per (kind, policy point), the same prompts
#      at the same concurrency, `full` first and again last (the run-to-run noise);
#   4. quality: `helios eval` per kind on the held-out text: perplexity increase, greedy agreement,
#      layers and LM-head rows per token, batch-1 decode speed-up;
#   5. pareto_report.py: bench/results/early_exit_<model>_<time>.{md,json} and a Pareto plot.
# Usage: bench/early_exit/run_early_exit_bench.sh [--model smollm2|qwen-0.5b|qwen-1.5b] [--kinds "lens ridge distilled mlp"] [--quick]
#   env: HELIOS_BIN (a folder with helios and heliosd: run those, build nothing), NUM_PROMPTS, CONCURRENCY (4), OUTPUT_LEN (48), CAL_TOKENS, DISTILL_EPOCHS (3), EVAL_TOKENS (2048),
#        DRAFT_VOCAB (16384: self-speculative drafts among the first N token ids; 0 = all),
#        EXITS, FIXED, DRAFT (the model's exit points, fixed depth and draft exit), MLP_HIDDEN (1024: the mlp kind's width), MLP_INIT (random, or last-ffn: the mlp kind from the last FFN),
#        HEADS_lens, HEADS_ridge, HEADS_distilled (a heads file to use for that kind instead of calibrating one)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
MODEL_KEY=smollm2
KINDS="lens ridge distilled"
QUICK=0
ARGS="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL_KEY=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Per model: file, exits, the fixed depth (three quarters), the self-speculative draft exit (half),
# calibration tokens and serving prompts (fewer for the bigger models: every point serves them all).
GIVEN_EXITS=${EXITS:-}; GIVEN_FIXED=${FIXED:-}; GIVEN_DRAFT=${DRAFT:-}
case "$MODEL_KEY" in
  smollm2)   MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf; EXITS=8,15,22; FIXED=22; DRAFT=15
             CAL_DEFAULT=8192; PROMPTS_DEFAULT=32 ;;
  qwen-0.5b) MODEL=$ROOT/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf; EXITS=6,12,18; FIXED=18; DRAFT=12
             CAL_DEFAULT=16384; PROMPTS_DEFAULT=16 ;;
  qwen-1.5b) MODEL=$ROOT/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf; EXITS=7,14,21; FIXED=21; DRAFT=14
             CAL_DEFAULT=16384; PROMPTS_DEFAULT=12 ;;
  *) echo "--model must be smollm2, qwen-0.5b or qwen-1.5b" >&2; exit 2 ;;
esac
EXITS=${GIVEN_EXITS:-$EXITS}; FIXED=${GIVEN_FIXED:-$FIXED}; DRAFT=${GIVEN_DRAFT:-$DRAFT}
CAL_TOKENS=${CAL_TOKENS:-$CAL_DEFAULT}  # distillation's cost grows with them: minutes per exit on 2 cores
DISTILL_EPOCHS=${DISTILL_EPOCHS:-3}
NUM_PROMPTS=${NUM_PROMPTS:-$PROMPTS_DEFAULT}
CONCURRENCY=${CONCURRENCY:-4}
OUTPUT_LEN=${OUTPUT_LEN:-48}
EVAL_TOKENS=${EVAL_TOKENS:-2048}
DRAFT_VOCAB=${DRAFT_VOCAB:-16384}
GEN_PROMPTS=8
THRESHOLDS="0.8 0.9"
if [ "$QUICK" = 1 ]; then NUM_PROMPTS=4; CAL_TOKENS=1024; EVAL_TOKENS=256; GEN_PROMPTS=2; THRESHOLDS="0.8"; fi

# Calibration: ShareGPT conversations with their replies (scripts/fetch_sharegpt.sh) where fetched, the
# text a server decodes; else the prompt-only sg90k sample.
SG_FULL=$ROOT/data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.first17671.json
[ -f "$SG_FULL" ] || SG_FULL=$ROOT/../shared/data/sharegpt/mlenergy_sg90k_first_prompts_2978_sorted.json
SG_CAL=${SG_CAL:-$SG_FULL}
GSM8K=${GSM8K:-$ROOT/../shared/data/intercept/gsm8k/test.jsonl}
SG_EVAL=${SG_EVAL:-$ROOT/../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json}
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=$ROOT/bench/results
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

[ -f "$MODEL" ] || { echo "missing $MODEL: run scripts/fetch_model.sh" >&2; exit 1; }
for f in "$SG_CAL" "$GSM8K" "$SG_EVAL"; do
  [ -f "$f" ] || { echo "missing $f: set SG_CAL, GSM8K and SG_EVAL (scripts/fetch_sharegpt.sh installs ShareGPT)" >&2; exit 1; }
done
BIN=${HELIOS_BIN:-$ROOT/build}   # HELIOS_BIN=DIR: helios and heliosd from there, not built here
export HELIOSD=$BIN/heliosd
if [ -z "${HELIOS_BIN:-}" ]; then
  echo "== build" >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build build -j"$(nproc)" --target helios heliosd > /dev/null
fi

/usr/bin/python3 bench/early_exit/split_text.py --calibration "$SG_CAL" "$GSM8K" --evaluation "$SG_EVAL" \
  --out "$WORK/eval_text.json" --report "$WORK/split.json"
EVAL_TEXT=$WORK/eval_text.json

heads_of() {  # HEADS_<kind> where set, else the file this script calibrates once
  local given="HEADS_$1"
  echo "${!given:-${MODEL%.gguf}.exits-$1-${CAL_TOKENS}.gguf}"
}
for kind in $KINDS; do
  heads=$(heads_of "$kind")
  if [ ! -f "$heads" ]; then
    echo "== calibrate $kind heads (once, $CAL_TOKENS tokens): $heads" >&2
    "$BIN/helios" calibrate --model "$MODEL" --exits "$EXITS" --text "$SG_CAL" --text "$GSM8K" \
      --max-tokens "$CAL_TOKENS" --head "$kind" --distill-epochs "$DISTILL_EPOCHS" \
      $([ "$kind" = mlp ] && if [ "${MLP_INIT:-random}" = last-ffn ]; then echo --mlp-init last-ffn --mlp-lr 1e-5;
                             else echo --mlp-hidden "${MLP_HIDDEN:-1024}"; fi) \
      --out "$heads" | tee "$WORK/calibrate_$kind.txt"
  fi
done

# One config per point: label, policy, threshold, depth, measure. Labels are KIND:POINT.
POINTS="full full 0.9 0 top1"
for kind in $KINDS; do
  for t in $THRESHOLDS; do POINTS="$POINTS
$kind:per-token-agreement-$t per-token $t 0 agreement"; done
  POINTS="$POINTS
$kind:fixed-depth-$FIXED fixed-depth 0 $FIXED top1
$kind:self-speculative-$DRAFT self-speculative 0.9 $DRAFT top1"
done
POINTS="$POINTS
full-repeat full 0.9 0 top1"  # full again, last: the run-to-run noise of the serving figures

configs=()
while read -r label policy threshold depth measure; do
  [ -n "$label" ] || continue
  kind=${label%%:*}
  heads_line=$([ "$kind" = "$label" ] || echo "heads: $(heads_of "$kind")")  # full: no heads
  file=$WORK/${label//:/__}.yaml
  cat > "$file" <<YAML
server:
  listen: 127.0.0.1:0
  metrics_listen: ""
models:
  - name: $MODEL_KEY
    path: $MODEL
    early_exit:
      policy: $policy
      measure: $measure
      threshold: $threshold
      depth: $depth
      draft_vocab: $DRAFT_VOCAB
      exits: [$EXITS]
      $heads_line
engine:
  threads: 0
  kv_cache: 1GiB
logging:
  level: warn
YAML
  configs+=(--config "$file" --label "$label")
done <<< "$POINTS"

echo "== throughput: helios-bench, $(( ${#configs[@]} / 4 )) servers, $NUM_PROMPTS prompts at concurrency $CONCURRENCY" >&2
bench/helios-bench "${configs[@]}" \
  --dataset prompts --dataset-path "$EVAL_TEXT" --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
  --max-concurrency "$CONCURRENCY" --result-dir "$WORK" --result-name serving --no-plots

echo "== quality: helios eval per kind on the held-out text" >&2
evals=()
for kind in $KINDS; do
  common=(--model "$MODEL" --heads "$(heads_of "$kind")" --exits "$EXITS" --text "$EVAL_TEXT"
          --max-tokens "$EVAL_TOKENS" --prompts "$GEN_PROMPTS" --gen-tokens 32)
  "$BIN/helios" eval "${common[@]}" --policy full,per-token --measure agreement \
    --threshold "$(echo $THRESHOLDS | tr ' ' ',')" --json "$WORK/eval_${kind}_agreement.json" >&2
  "$BIN/helios" eval "${common[@]}" --policy fixed-depth --depth "$FIXED" --json "$WORK/eval_${kind}_fixed.json" >&2
  "$BIN/helios" eval "${common[@]}" --policy self-speculative --depth "$DRAFT" \
    --draft-vocab "$DRAFT_VOCAB" --json "$WORK/eval_${kind}_spec.json" >&2
  evals+=("$kind=$WORK/eval_${kind}_agreement.json" "$kind=$WORK/eval_${kind}_fixed.json" "$kind=$WORK/eval_${kind}_spec.json")
done
for kind in $KINDS; do [ -f "$WORK/calibrate_$kind.txt" ] && cp "$WORK/calibrate_$kind.txt" "$OUT/early_exit_${MODEL_KEY}_${STAMP}_calibrate_$kind.txt"; done

/usr/bin/python3 bench/early_exit/pareto_report.py --serving "$WORK/serving.json" --eval "${evals[@]}" \
  --split "$WORK/split.json" --model-name "$MODEL_KEY" \
  --command "bench/early_exit/run_early_exit_bench.sh $ARGS" --out "$OUT/early_exit_${MODEL_KEY}_$STAMP"
