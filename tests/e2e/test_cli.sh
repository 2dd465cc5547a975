#!/usr/bin/env bash
# End to end: the real `helios` program on real models, checking its output streams, exit codes
# and error messages. Usage: test_cli.sh HELIOS_BINARY SOURCE_DIR
set -uo pipefail
HELIOS="$1"
SRC="$2"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
STORIES="$SRC/tests/data/stories260K"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
passes=0

check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $name"; failures=$((failures + 1)); fi
}
contains() { grep -qF -- "$2" "$1"; }
lines() { wc -l < "$1" | tr -d ' '; }

check "the default model is in the models cache (scripts/fetch_model.sh fetches it)" test -f "$MODEL"

# --- help teaches
"$HELIOS" --help > "$WORK/help" 2>&1; check "helios --help exits 0" test $? -eq 0
check "top-level help lists generate" contains "$WORK/help" "generate"
check "top-level help lists convert-llama2c" contains "$WORK/help" "convert-llama2c"
for cmd in generate inspect convert-llama2c make-synthetic; do
  "$HELIOS" "$cmd" --help > "$WORK/h_$cmd" 2>&1; check "$cmd --help exits 0" test $? -eq 0
  check "$cmd --help shows usage" contains "$WORK/h_$cmd" "usage: helios $cmd"
done
check "generate --help documents --max-tokens" contains "$WORK/h_generate" "--max-tokens"

# --- bad input: one line, non-zero exit
"$HELIOS" generate --model "$MODEL" --prompt hi --bogus 1 > "$WORK/out" 2> "$WORK/err"
code=$?
check "unknown option exits non-zero" test $code -ne 0
check "unknown option is named" contains "$WORK/err" "--bogus"
check "unknown option error is one line" test "$(lines "$WORK/err")" -eq 1
"$HELIOS" generate --model "$WORK/missing.gguf" --prompt hi > "$WORK/out" 2> "$WORK/err"
check "missing model exits non-zero" test $? -ne 0
check "missing model error names the file" contains "$WORK/err" "missing.gguf"
check "missing model error is one line" test "$(lines "$WORK/err")" -eq 1
echo "not a model" > "$WORK/bad.gguf"
"$HELIOS" generate --model "$WORK/bad.gguf" --prompt hi > "$WORK/out" 2> "$WORK/err"
check "non-GGUF file exits non-zero" test $? -ne 0
check "non-GGUF file error says so" contains "$WORK/err" "not a GGUF model file"
"$HELIOS" generate --model "$MODEL" --prompt hi --temperature -1 > "$WORK/out" 2> "$WORK/err"
check "negative temperature refused" test $? -ne 0
check "negative temperature error names the field" contains "$WORK/err" "temperature"
"$HELIOS" frobnicate > "$WORK/out" 2> "$WORK/err"
check "unknown command exits non-zero" test $? -ne 0

# --- llama2.c conversion and its reference output
"$HELIOS" convert-llama2c --checkpoint "$STORIES/stories260K.bin" --tokenizer "$STORIES/tok512.bin" \
  --out "$WORK/stories.gguf" 2> "$WORK/err"
check "convert-llama2c succeeds" test $? -eq 0
"$HELIOS" generate --model "$WORK/stories.gguf" --prompt "" --max-tokens 40 > "$WORK/out" 2> "$WORK/err"
check "stories260K generate succeeds" test $? -eq 0
check "stdout holds only the generated story" contains "$WORK/out" " Once upon a time, there was a little girl named Lily."
check "stderr reports decode speed" contains "$WORK/err" "decode"
check "stderr reports load time" contains "$WORK/err" "load"

# --- the default model
"$HELIOS" generate --model "$MODEL" --prompt "The capital of France is" --max-tokens 8 > "$WORK/out" 2> "$WORK/err"
check "SmolLM2 generate succeeds" test $? -eq 0
check "SmolLM2 knows Paris" contains "$WORK/out" "Paris"
check "the prompt is not echoed" test "$(grep -c "The capital of France" "$WORK/out")" -eq 0
"$HELIOS" generate --model "$MODEL" --chat --prompt "Say hello." --max-tokens 16 --temperature 0.7 \
  --top-k 40 --top-p 0.9 --seed 3 > "$WORK/chat1" 2> /dev/null
"$HELIOS" generate --model "$MODEL" --chat --prompt "Say hello." --max-tokens 16 --temperature 0.7 \
  --top-k 40 --top-p 0.9 --seed 3 > "$WORK/chat2" 2> /dev/null
check "sampled chat output is not empty" test -s "$WORK/chat1"
check "the same seed gives the same text" cmp -s "$WORK/chat1" "$WORK/chat2"
# A chat samples by default, as llama.cpp's CLI does; --temperature 0 makes it greedy again.
for seed in 1 2 3; do
  "$HELIOS" generate --model "$MODEL" --chat --prompt "Tell me a story." --max-tokens 24 --seed $seed \
    > "$WORK/chat_s$seed" 2> /dev/null
done
check "a chat samples by default: other seeds, other text" \
  bash -c "! (cmp -s '$WORK/chat_s1' '$WORK/chat_s2' && cmp -s '$WORK/chat_s1' '$WORK/chat_s3')"
for seed in 1 2; do
  "$HELIOS" generate --model "$MODEL" --chat --prompt "Tell me a story." --max-tokens 24 --seed $seed \
    --temperature 0 > "$WORK/chat_g$seed" 2> /dev/null
done
check "a chat with --temperature 0 is greedy: the seed changes nothing" cmp -s "$WORK/chat_g1" "$WORK/chat_g2"
"$HELIOS" generate --prompt x --help > "$WORK/h_gen_chat" 2>&1
check "generate --help gives the chat sampling defaults" contains "$WORK/h_gen_chat" "0.8 / 40 / 0.95 / 0.05"
if "$HELIOS" chat --help > "$WORK/h_chat" 2>&1; then
  check "helios chat defaults to temperature 0.8" contains "$WORK/h_chat" "(default: 0.8)"
  check "helios chat defaults to min-p 0.05" contains "$WORK/h_chat" "(default: 0.05)"
fi
"$HELIOS" generate --model "$MODEL" --prompt "Count: 1, 2, 3," --stop "5" --max-tokens 32 > "$WORK/out" 2> "$WORK/err"
check "a stop string ends the output before it" test "$(grep -c 5 "$WORK/out")" -eq 0
check "a stop string is the finish reason" contains "$WORK/err" "finish: stop"

# --- inspect and synthetic models
"$HELIOS" inspect "$MODEL" --tensors 3 > "$WORK/out" 2> "$WORK/err"
check "inspect succeeds" test $? -eq 0
check "inspect shows the architecture" contains "$WORK/out" "general.architecture"
check "inspect counts parameters" contains "$WORK/out" "parameters:"
check "inspect shows the model shape" contains "$WORK/out" "30 layers"
"$HELIOS" make-synthetic --preset tiny --type Q8_0 --layers 3 --seed 9 --out "$WORK/syn.gguf" 2> "$WORK/err"
check "make-synthetic succeeds" test $? -eq 0
"$HELIOS" inspect "$WORK/syn.gguf" > "$WORK/out"
check "synthetic model has the asked shape" contains "$WORK/out" "3 layers"
check "synthetic model has the asked type" contains "$WORK/out" "Q8_0"
"$HELIOS" generate --model "$WORK/syn.gguf" --prompt "abc" --max-tokens 5 --ignore-eos > "$WORK/out" 2> "$WORK/err"
check "a synthetic model generates" test $? -eq 0
"$HELIOS" make-synthetic --preset tiny --heads 5 --out "$WORK/x.gguf" > /dev/null 2> "$WORK/err"
check "an impossible shape is refused" test $? -ne 0

# --- rope scaling: in the file (make-synthetic, inspect) and set at load (--rope-scaling)
"$HELIOS" make-synthetic --preset tiny --rope-yarn 4 --rope-original-ctx 4096 --out "$WORK/yarn.gguf" 2> "$WORK/err"
check "make-synthetic writes YaRN scaling" test $? -eq 0
"$HELIOS" inspect "$WORK/yarn.gguf" > "$WORK/out"
check "inspect shows the YaRN scaling" contains "$WORK/out" "rope scaling: YaRN by 4"
check "YaRN serves its original context times its factor" contains "$WORK/out" "context 16384"
"$HELIOS" generate --model "$WORK/yarn.gguf" --prompt "abc" --max-tokens 5 --ignore-eos --temperature 0 > "$WORK/yarn_out" 2> "$WORK/err"
check "a YaRN model generates" test $? -eq 0
"$HELIOS" make-synthetic --preset tiny --out "$WORK/plain.gguf" 2> "$WORK/err"
"$HELIOS" generate --model "$WORK/plain.gguf" --rope-scaling yarn:4:4096 --prompt "abc" --max-tokens 5 --ignore-eos \
  --temperature 0 > "$WORK/set_out" 2> "$WORK/err"
check "--rope-scaling gives what the file's keys give" cmp -s "$WORK/yarn_out" "$WORK/set_out"
"$HELIOS" generate --model "$WORK/plain.gguf" --rope-scaling yarn:x --prompt "abc" > "$WORK/out" 2> "$WORK/err"
check "a malformed --rope-scaling is refused" test $? -ne 0
check "the error shows the expected form" contains "$WORK/err" "yarn:F[:CTX]"

echo "$passes passed, $failures failed"
test "$failures" -eq 0
