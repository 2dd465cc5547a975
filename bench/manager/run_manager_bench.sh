#!/usr/bin/env bash
# The Helios model manager beside single-model serving on the Qwen2.5-Coder pair, CPU, on one
# mixed prompt stream (ShareGPT, GSM8K questions, code prompts; fixed seed), in the Helios paper's
# structure:
#   1. throughput, TTFT and TPOT at batch 1 (concurrency 1) and under load (concurrency 4): each
#      configuration is one heliosd, all in one helios-bench compare run per concurrency, full-0.5b
#      first and again last (the run-to-run noise): full depth (0.5B, 1.5B), per-token early exit
#      (agreement >= 0.8 with the distilled heads) of each, and the manager's group over both;
#   2. quality: every configuration's batch-1 outputs judged by the 1.5B at full depth
#      (`helios score`: judge perplexity and teacher-forced agreement), beside the self-perplexity
#      the manager records;
#   3. the exit distribution per configuration, the manager's throughput over time with its
#      decisions marked, and the largest batch a fixed budget holds at each loaded depth;
#   4. sweeps of the manager's RI and threshold (SWEEPS=1; minutes each).
# bench/manager/manager_report.py writes bench/results/manager_<time>.{md,json} and the plots.
# Usage: bench/manager/run_manager_bench.sh [--quick]
#   env: NUM_PROMPTS (45), OUTPUT_LEN (32), HEADS_KIND (distilled: the newest models/*.exits-KIND-*.gguf, from
#        bench/early_exit/; none = logit lens), BUDGET (3GiB), RI (30), THRESHOLD (0.8), SWEEPS (0),
#        HELIOS_BIN (prebuilt helios and heliosd; else build/), KEEP_WORK (1: keep the configs, reports and logs)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
NUM_PROMPTS=${NUM_PROMPTS:-45}
OUTPUT_LEN=${OUTPUT_LEN:-32}
HEADS_KIND=${HEADS_KIND:-distilled}
BUDGET=${BUDGET:-3GiB}
RI=${RI:-30}
THRESHOLD=${THRESHOLD:-0.8}
SWEEPS=${SWEEPS:-0}
ARGS="$*"
if [ "${1:-}" = "--quick" ]; then NUM_PROMPTS=12; OUTPUT_LEN=8; RI=6; fi
SMALL=$ROOT/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf
BIG=$ROOT/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf
SG=${SG:-$ROOT/../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json}
GSM8K=${GSM8K:-$ROOT/../shared/data/intercept/gsm8k/test.jsonl}
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
OUT=$ROOT/bench/results
WORK=$(mktemp -d)
if [ -n "${KEEP_WORK:-}" ]; then echo "work files stay in $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi
for f in "$SMALL" "$BIG"; do [ -f "$f" ] || { echo "missing $f: run scripts/fetch_model.sh qwen-pair" >&2; exit 1; }; done
for f in "$SG" "$GSM8K"; do [ -f "$f" ] || { echo "missing $f: set SG and GSM8K" >&2; exit 1; }; done

BIN=${HELIOS_BIN:-$ROOT/build}
export HELIOSD=$BIN/heliosd
if [ -z "${HELIOS_BIN:-}" ]; then
  echo "== build" >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build build -j"$(nproc)" --target helios heliosd > /dev/null
fi

heads_line() {  # the newest heads file of that kind next to the model, if any
  [ "$HEADS_KIND" != none ] || return 0
  local h
  h=$(ls -t "${1%.gguf}".exits-"$HEADS_KIND"-*.gguf 2> /dev/null | head -1)
  if [ -n "$h" ]; then echo "heads: $h"; fi
}
measure() { [ -n "$(heads_line "$1")" ] && echo agreement || echo top1; }
SMALL_HEADS=$(heads_line "$SMALL"); BIG_HEADS=$(heads_line "$BIG")
[ -n "$SMALL_HEADS" ] || echo "note: no $HEADS_KIND heads for the 0.5B (bench/early_exit/run_early_exit_bench.sh --model qwen-0.5b makes them): logit lens" >&2
[ -n "$BIG_HEADS" ] || echo "note: no $HEADS_KIND heads for the 1.5B: logit lens" >&2

/usr/bin/python3 bench/manager/make_stream.py --sharegpt "$SG" --gsm8k "$GSM8K" --num "$NUM_PROMPTS" --seed 0 \
  --out "$WORK/stream.json" --report "$WORK/stream_report.json"

common_yaml() {
  cat <<YAML
server:
  listen: 127.0.0.1:0
  metrics_listen: ""
engine:
  threads: 0
  kv_cache: 1GiB
  max_seqs: 16
logging:
  level: info
YAML
}
single() {  # name path exits policy measure heads_line
  common_yaml
  cat <<YAML
models:
  - name: $1
    path: $2
    early_exit:
      policy: $4
      measure: $5
      threshold: $THRESHOLD
      exits: [$3]
      $6
YAML
}
group() {  # threshold ri
  common_yaml
  cat <<YAML
model_repository:
  - name: qwen-0.5b
    path: $SMALL
    early_exit:
      exits: [6, 12, 18]
      $SMALL_HEADS
  - name: qwen-1.5b
    path: $BIG
    early_exit:
      exits: [7, 14, 21]
      $BIG_HEADS
groups:
  - name: coder
    slo: throughput
    memory_budget: $BUDGET
    measure: $( [ -n "$SMALL_HEADS" ] && [ -n "$BIG_HEADS" ] && echo agreement || echo top1 )
    threshold: $1
    evaluation_requests: 5
    reassess_every: $2
YAML
}
single full-0.5b "$SMALL" 6,12,18 full top1 "" > "$WORK/full-0.5b.yaml"
single full-1.5b "$BIG" 7,14,21 full top1 "" > "$WORK/full-1.5b.yaml"
single ee-0.5b "$SMALL" 6,12,18 per-token "$(measure "$SMALL")" "$SMALL_HEADS" > "$WORK/ee-0.5b.yaml"
single ee-1.5b "$BIG" 7,14,21 per-token "$(measure "$BIG")" "$BIG_HEADS" > "$WORK/ee-1.5b.yaml"
group "$THRESHOLD" "$RI" > "$WORK/manager.yaml"
cp "$WORK/full-0.5b.yaml" "$WORK/full-0.5b-repeat.yaml"

bench() {  # name concurrency configs...
  local name=$1 conc=$2; shift 2
  local cfgs=()
  for c in "$@"; do cfgs+=(--config "$WORK/$c.yaml"); done
  echo "== $name: concurrency $conc, $NUM_PROMPTS prompts x $OUTPUT_LEN tokens, servers: $*" >&2
  bench/helios-bench "${cfgs[@]}" --dataset prompts --dataset-path "$WORK/stream.json" --num-prompts "$NUM_PROMPTS" \
    --output-len "$OUTPUT_LEN" --max-concurrency "$conc" --seed 0 --result-dir "$WORK" --result-name "$name" \
    --keep-server-logs --no-plots
}
if [ "$SWEEPS" = only ]; then  # just the manager's RI and threshold sweeps, at concurrency 4
  for ri in ${SWEEP_RI:-10 20 40}; do group "$THRESHOLD" "$ri" > "$WORK/manager-ri$ri.yaml"; done
  for t in ${SWEEP_THRESHOLDS:-0.5 0.6 0.9}; do group "$t" "$RI" > "$WORK/manager-t$t.yaml"; done
  points=()
  for ri in ${SWEEP_RI:-10 20 40}; do points+=("manager-ri$ri"); done
  for t in ${SWEEP_THRESHOLDS:-0.5 0.6 0.9}; do points+=("manager-t$t"); done
  bench sweep 4 "${points[@]}"
  /usr/bin/python3 bench/manager/sweep_report.py --sweep "$WORK/sweep.json" --logs "$WORK" \
    --command "SWEEPS=only bench/manager/run_manager_bench.sh $ARGS" --out "$OUT/manager_sweep_$STAMP"
  exit 0
fi
POINTS="full-0.5b full-1.5b ee-0.5b ee-1.5b manager full-0.5b-repeat"
bench batch1 1 $POINTS
bench load4 4 $POINTS

echo "== quality: the 1.5B at full depth judges every configuration's batch-1 outputs" >&2
"$BIN/helios" score --model "$BIG" --report "$WORK/batch1.json" --json "$WORK/judge.json" >&2

sweeps=()
if [ "$SWEEPS" = 1 ]; then
  for ri in 10 20 40; do group "$THRESHOLD" "$ri" > "$WORK/manager-ri$ri.yaml"; done
  for t in 0.6 0.9; do group "$t" "$RI" > "$WORK/manager-t$t.yaml"; done
  bench sweep 4 manager-ri10 manager-ri20 manager-ri40 manager-t0.6 manager-t0.9
  sweeps=(--sweep "$WORK/sweep.json")
fi

"$BIN/helios" inspect "$SMALL" > "$WORK/inspect-0.5b.txt"
"$BIN/helios" inspect "$BIG" > "$WORK/inspect-1.5b.txt"
/usr/bin/python3 bench/manager/manager_report.py --batch1 "$WORK/batch1.json" --load "$WORK/load4.json" \
  --judge "$WORK/judge.json" --stream "$WORK/stream_report.json" --stream-file "$WORK/stream.json" \
  --logs "$WORK" --inspect "qwen-0.5b=$WORK/inspect-0.5b.txt" "qwen-1.5b=$WORK/inspect-1.5b.txt" \
  --budget "$BUDGET" "${sweeps[@]}" --command "bench/manager/run_manager_bench.sh $ARGS" --out "$OUT/manager_$STAMP"
