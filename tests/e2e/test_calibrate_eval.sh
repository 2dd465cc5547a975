#!/usr/bin/env bash
# End to end: `helios calibrate` fits exit heads for stories260K into the sidecar next to the
# model, then `helios eval` picks them up and compares policies with full.
# Usage: test_calibrate_eval.sh HELIOS_BINARY SOURCE_DIR
set -uo pipefail
HELIOS="$1"
SRC="$2"
DATA="$SRC/tests/data"
STORIES="$DATA/stories260K"
CAL_TEXT="$DATA/sharegpt/ShareGPT_V3_filtered_first80_prompts.json"
EVAL_TEXT="$CAL_TEXT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
passes=0

check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $name"; failures=$((failures + 1)); fi
}
contains() { grep -qF -- "$2" "$1"; }
# The table row of a policy (and threshold): "| per-token | top1 | 1.00 |".
row() { grep -F -- "| $2 |" "$1" | head -1; }

# The model lives in the work directory so the default sidecar path lands there too.
MODEL="$WORK/stories.gguf"
if ! "$HELIOS" convert-llama2c --checkpoint "$STORIES/stories260K.bin" --tokenizer "$STORIES/tok512.bin" \
    --out "$MODEL" 2> "$WORK/err"; then
  cat "$WORK/err"
  echo "FAIL: cannot convert $STORIES/stories260K.bin (restore it with git checkout -- tests/data)"
  exit 1
fi

# --- help and usage errors
for cmd in calibrate eval profile; do
  "$HELIOS" "$cmd" --help > "$WORK/h_$cmd" 2>&1; check "$cmd --help exits 0" test $? -eq 0
  check "$cmd --help shows usage" contains "$WORK/h_$cmd" "usage: helios $cmd"
  check "$cmd --help has examples" contains "$WORK/h_$cmd" "examples:"
  "$HELIOS" "$cmd" --model "$MODEL" > "$WORK/out" 2> "$WORK/err"
  check "$cmd without --text exits 2" test $? -eq 2
  check "$cmd without --text says so" contains "$WORK/err" "--text FILE is required"
  "$HELIOS" "$cmd" --model "$MODEL" --text "$WORK/missing.txt" > "$WORK/out" 2> "$WORK/err"
  check "$cmd with a missing text fails" test $? -ne 0
  check "$cmd names the missing text" contains "$WORK/err" "missing.txt"
done
"$HELIOS" --help > "$WORK/help" 2>&1
check "top-level help lists calibrate" contains "$WORK/help" "calibrate"
check "top-level help lists eval" contains "$WORK/help" "eval "

# --- calibrate: default output next to the model
"$HELIOS" calibrate --model "$MODEL" --exits 1,2,3,4 --text "$CAL_TEXT" --max-tokens 4096 --seq-len 128 \
  --threads 1 > "$WORK/cal.out" 2> "$WORK/cal.err"
check "calibrate succeeds" test $? -eq 0
check "calibrate writes MODEL.exits.gguf" test -s "$WORK/stories.exits.gguf"
check "calibrate prints the table header" contains "$WORK/cal.out" "| layer | logit-lens agreement | ridge agreement | distilled agreement | mlp agreement | head kept |"
for layer in 1 2 3 4; do
  check "calibrate reports exit $layer" test -n "$(grep -E "^\| $layer \| [0-9.]+% \| [0-9.]+% \| - \| - \| (ridge|identity) \|" "$WORK/cal.out")"
done
check "calibrate says where it wrote" contains "$WORK/cal.out" "wrote $WORK/stories.exits.gguf"
check "calibrate reports progress on stderr" contains "$WORK/cal.err" "tokens through the model"
check "stdout has no progress" test "$(grep -c "through the model" "$WORK/cal.out")" -eq 0
"$HELIOS" calibrate --model "$MODEL" --exits 5 --text "$CAL_TEXT" --max-tokens 256 > "$WORK/out" 2> "$WORK/err"
check "calibrate refuses the last layer as an exit" test $? -ne 0
check "the exit error names the range" contains "$WORK/err" "[1, 4]"

# --- calibrate --distill: the distilled column is filled, a distilled or ridge head is kept
"$HELIOS" calibrate --model "$MODEL" --exits 1,3 --text "$CAL_TEXT" --max-tokens 2048 --seq-len 128 --distill \
  --distill-epochs 2 --out "$WORK/distilled.exits.gguf" --threads 1 > "$WORK/dist.out" 2> "$WORK/dist.err"
check "calibrate --distill succeeds" test $? -eq 0
for layer in 1 3; do
  check "distilled agreement of exit $layer" test -n "$(grep -E "^\| $layer \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \| - \| (distilled|ridge|identity) \|" "$WORK/dist.out")"
done
check "distillation reports its epochs on stderr" contains "$WORK/dist.err" "distill: epoch 2/2"
check "distillation reports its cost" contains "$WORK/dist.out" "distilled in"

# --- calibrate --mlp-hidden --head mlp: a residual MLP after the distilled adapter, kept, in the sidecar
"$HELIOS" calibrate --model "$MODEL" --exits 1,3 --text "$CAL_TEXT" --max-tokens 2048 --seq-len 128 --mlp-hidden 32 \
  --head mlp --distill-epochs 2 --out "$WORK/mlp.exits.gguf" --threads 1 > "$WORK/mlp.out" 2> "$WORK/mlp.err"
check "calibrate --head mlp succeeds" test $? -eq 0
for layer in 1 3; do
  check "mlp head kept at exit $layer" test -n "$(grep -E "^\| $layer \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \| mlp \|" "$WORK/mlp.out")"
done
check "the MLP reports its epochs on stderr" contains "$WORK/mlp.err" "mlp: epoch 2/2"
check "the MLP reports its cost" contains "$WORK/mlp.out" "residual MLP (32 hidden) trained in"
"$HELIOS" calibrate --model "$MODEL" --exits 1 --text "$CAL_TEXT" --max-tokens 256 --head mlp > "$WORK/out" 2> "$WORK/err"
check "--head mlp without --mlp-hidden is refused" test $? -eq 2
check "the refusal says what to add" contains "$WORK/err" "--mlp-hidden"

# --- calibrate --mlp-init last-ffn: the MLP head starts from the model's last FFN (its width)
"$HELIOS" calibrate --model "$MODEL" --exits 1,3 --text "$CAL_TEXT" --max-tokens 2048 --seq-len 128 \
  --mlp-init last-ffn --mlp-lr 1e-4 --head mlp --distill-epochs 1 --out "$WORK/ffn.exits.gguf" --threads 1 \
  > "$WORK/ffn.out" 2> "$WORK/ffn.err"
check "calibrate --mlp-init last-ffn succeeds" test $? -eq 0
check "it says where the MLP starts" contains "$WORK/ffn.err" "MLP heads start from the last block's FFN"
for layer in 1 3; do
  check "last-ffn mlp head kept at exit $layer" test -n "$(grep -E "^\| $layer \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \| mlp \|" "$WORK/ffn.out")"
done
n_ff=$("$HELIOS" inspect "$MODEL" 2>/dev/null | grep -oE "feed_forward_length[^0-9]*[0-9]+" | grep -oE "[0-9]+$" | head -1)
check "the MLP has the FFN's width ($n_ff)" contains "$WORK/ffn.out" "residual MLP ($n_ff hidden) trained in"
"$HELIOS" calibrate --model "$MODEL" --exits 1 --text "$CAL_TEXT" --max-tokens 256 --mlp-init last-ffn --mlp-hidden 8 \
  > "$WORK/out" 2> "$WORK/err"
check "--mlp-init last-ffn with --mlp-hidden is refused" test $? -eq 2
check "the refusal names --mlp-hidden" contains "$WORK/err" "leave out --mlp-hidden"
"$HELIOS" calibrate --model "$MODEL" --exits 1 --text "$CAL_TEXT" --max-tokens 256 --mlp-init zeros > "$WORK/out" 2> "$WORK/err"
check "an unknown --mlp-init is refused" test $? -eq 2
check "the refusal lists the choices" contains "$WORK/err" "random or last-ffn"

# --- profile: teacher-forced and free-running, with the observe mode's cost
"$HELIOS" profile --model "$MODEL" --heads "$WORK/distilled.exits.gguf" --exits 1,3 --text "$EVAL_TEXT" --skip 40 \
  --max-tokens 512 --seq-len 128 --prompts 2 --gen-tokens 16 --threads 1 --json "$WORK/profile.json" \
  > "$WORK/profile.out" 2> "$WORK/profile.err"
check "profile succeeds" test $? -eq 0
check "profile has a teacher-forced section" contains "$WORK/profile.out" "## teacher-forced (512 tokens)"
check "profile has a free-running section" contains "$WORK/profile.out" "## free-running (32 tokens)"
check "profile shows the agreement measure" contains "$WORK/profile.out" "by the \`agreement\` measure"
check "profile reports the observe cost" contains "$WORK/profile.out" "Observe mode"
check "profile writes JSON with both modes" \
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert [p['mode'] for p in j['profiles']]==['teacher-forced','free-running'] and j['profiles'][0]['layers'][1]['layer']==3" "$WORK/profile.json"
"$HELIOS" profile --model "$MODEL" --exits 1 --text "$EVAL_TEXT" --skip 100000 > "$WORK/out" 2> "$WORK/err"
check "profile refuses a skip past the text" test $? -eq 2

# --- eval: picks up the sidecar; full first; self-speculative and threshold 1 agree with full
"$HELIOS" eval --model "$MODEL" --text "$EVAL_TEXT" --policy full,per-token,fixed-depth,self-speculative \
  --threshold 0,1 --depth 2 --max-tokens 1024 --seq-len 128 --prompts 4 --gen-tokens 16 --threads 1 \
  --json "$WORK/eval.json" > "$WORK/eval.out" 2> "$WORK/eval.err"
check "eval succeeds" test $? -eq 0
check "eval uses the calibrated heads" contains "$WORK/eval.err" "stories.exits.gguf"
check "eval prints the table header" contains "$WORK/eval.out" "| policy | measure | threshold | depth | perplexity |"
check "full is the first row" test "$(sed -n 3p "$WORK/eval.out" | cut -d'|' -f2 | tr -d ' ')" = "full"
# full, per-token and self-speculative at each threshold, fixed-depth once
check "eval has one row per rule" test "$(grep -c 'x |$' "$WORK/eval.out")" -eq 6
check "self-speculative agrees with full" contains <(row "$WORK/eval.out" "self-speculative | top1 | 0.00") "| 100.0% | 100% |"
check "self-speculative that never drafts agrees with full" \
  contains <(row "$WORK/eval.out" "self-speculative | top1 | 1.00") "| 100.0% | 100% |"
check "threshold 1 agrees with full" contains <(row "$WORK/eval.out" "per-token | top1 | 1.00") "| 100.0% | 100% |"
check "threshold 1 keeps full depth" contains <(row "$WORK/eval.out" "per-token | top1 | 1.00") "| 5.00 / 5 |"
check "threshold 0 leaves at the first exit" contains <(row "$WORK/eval.out" "per-token | top1 | 0.00") "| 1.00 / 5 |"
check "fixed-depth runs at --depth" contains <(row "$WORK/eval.out" "fixed-depth") "| 2.00 / 5 |"
check "eval reports progress on stderr" contains "$WORK/eval.err" "eval: self-speculative"
check "eval writes valid JSON with every row" \
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['rows'])==6 and j['rows'][0]['policy']=='full'" "$WORK/eval.json"
check "self-speculative drafts at threshold 0 and never at 1" \
  python3 -c "import json,sys; s=[r for r in json.load(open(sys.argv[1]))['rows'] if r['policy']=='self-speculative']; assert [r['threshold'] for r in s]==[0,1] and s[0]['drafted']>0 and s[1]['drafted']==0, s" "$WORK/eval.json"

# --- the probe measure needs calibrated heads
"$HELIOS" eval --model "$MODEL" --text "$EVAL_TEXT" --policy per-token --measure probe --threshold 0.5 \
  --max-tokens 512 --prompts 2 --gen-tokens 8 --threads 1 > "$WORK/probe.out" 2> "$WORK/probe.err"
check "eval with the probe measure succeeds" test $? -eq 0
check "probe row present" contains "$WORK/probe.out" "| per-token | probe | 0.50 |"
"$HELIOS" eval --model "$MODEL" --heads none --text "$EVAL_TEXT" --policy per-token --measure probe \
  --max-tokens 512 --prompts 2 --gen-tokens 8 > "$WORK/out" 2> "$WORK/err"
check "the probe without heads is refused" test $? -ne 0
check "the refusal says to calibrate" contains "$WORK/err" "helios calibrate"

echo "$passes passed, $failures failed"
test "$failures" -eq 0
