#!/usr/bin/env bash
# End to end: `helios score` judges a helios-bench report's outputs. The judge scoring its own
# greedy output must agree with it and find it likelier than the same tokens reversed.
# Usage: test_score.sh HELIOS_BINARY SOURCE_DIR
set -uo pipefail
HELIOS="$1"
SRC="$2"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
passes=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $name"; failures=$((failures + 1)); fi
}
contains() { grep -qF -- "$2" "$1"; }

PROMPT="The capital of France is"
"$HELIOS" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 24 --ignore-eos --kv-type f32 --show-exits \
  > /dev/null 2> "$WORK/gen.err"
check "generate runs" test $? -eq 0
/usr/bin/python3 - "$WORK" "$PROMPT" <<'PY'
import json, re, sys
work, prompt = sys.argv[1], sys.argv[2]
ids = [int(m.group(1)) for m in re.finditer(r"^token \d+ id (\d+)", open(f"{work}/gen.err").read(), re.M)]
report = {"workload": [{"prompt": prompt, "prompt_len": 8}],
          "runs": [{"label": "greedy@inf", "requests": [{"index": 0, "ok": True, "token_ids": ids}]},
                   {"label": "reversed@inf", "requests": [{"index": 0, "ok": True, "token_ids": ids[::-1]}]},
                   {"label": "failed@inf", "requests": [{"index": 0, "ok": False, "token_ids": ids}]}]}
json.dump(report, open(f"{work}/report.json", "w"))
PY
"$HELIOS" score --model "$MODEL" --report "$WORK/report.json" --json "$WORK/score.json" > "$WORK/out" 2> "$WORK/err"
check "score exits 0" test $? -eq 0
check "score prints a table" contains "$WORK/out" "| greedy@inf | 1 | 24 |"
/usr/bin/python3 - "$WORK/score.json" > "$WORK/verdict" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
g, r, f = runs["greedy@inf"], runs["reversed@inf"], runs["failed@inf"]
print("agree" if g["judge_agreement"] >= 0.95 else f"greedy agreement {g['judge_agreement']}")
print("likelier" if g["judge_perplexity"] < r["judge_perplexity"] else "greedy is not likelier")
print("reversed disagrees" if r["judge_agreement"] < 0.5 else "reversed agrees")
print("failed skipped" if f["requests"] == 0 else "failed request counted")
PY
for word in agree likelier "reversed disagrees" "failed skipped"; do
  check "score: $word" grep -qx "$word" "$WORK/verdict"
done
echo '{"runs": []}' > "$WORK/bad.json"
"$HELIOS" score --model "$MODEL" --report "$WORK/bad.json" > "$WORK/out" 2> "$WORK/err"
check "a report without a workload is refused" test $? -ne 0
check "the error names the file" contains "$WORK/err" "bad.json"
echo "test_score.sh: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
