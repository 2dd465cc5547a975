#!/usr/bin/env bash
# The intercept benchmark (INFERCEPT's evaluation on heliosd's Session RPC): every hold policy at
# every request rate on one workload, one heliosd started from a config written under /tmp.
# Results: bench/results/intercept_<model>_<UTC date>.{json,md,png}. bench/README.md explains it.
#
#   bench/intercept/run_intercept_bench.sh
#   RATES=0.5,1,2,4 N_REQUESTS=60 PAUSE_SCALE=0.1 bench/intercept/run_intercept_bench.sh
#   WORKLOAD=qa POLICIES=discard,min-waste bench/intercept/run_intercept_bench.sh --max-context 1024
#
# Environment (each one a flag of `python3 -m bench.intercept.run --help`; flags given after the
# script's name are passed on and win):
#   MODEL        smollm2 (default) | qwen-0.5b | qwen-1.5b | a .gguf path
#   RATES        request rates, req/s (default 0.25,0.5,1)
#   POLICIES     hold policies (default discard,improved-discard,preserve,swap,min-waste)
#   N_REQUESTS   requests per (policy, rate) run (default 30)
#   WORKLOAD     mixed | math | qa | ve | chatbot | image | tts | toolcall (default mixed)
#   PAUSE_SCALE  multiplies every pause and the server's pause priors (default 1)
#   KV_CACHE     engine.kv_cache (default 128MiB: small enough that paused KV competes)
#   SEED         workload, pauses and arrivals (default 0)
#   MAX_CONTEXT, MAX_SEGMENT_TOKENS, MAX_INTERCEPTS, THREADS, HELIOSD, ADDRESS (a running server)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PY="${HELIOS_BENCH_PYTHON:-/usr/bin/python3}"
if ! "$PY" -c 'import grpc, grpc.aio, grpc_tools.protoc' 2>/dev/null; then
  echo "run_intercept_bench: $PY lacks grpcio / grpc_tools (scripts/install_deps.sh)" >&2
  exit 1
fi

MODEL="${MODEL:-smollm2}"
case "$MODEL" in
  smollm2|smollm2-135m) model_path=models/SmolLM2-135M-Instruct.Q4_1.gguf; fetch=smollm2-135m ;;
  qwen-0.5b|qwen2.5-coder-0.5b) model_path=models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf; fetch=qwen2.5-coder-0.5b ;;
  qwen-1.5b|qwen2.5-coder-1.5b) model_path=models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf; fetch=qwen2.5-coder-1.5b ;;
  *.gguf) model_path="$MODEL"; fetch="" ;;
  *) echo "run_intercept_bench: MODEL must be smollm2, qwen-0.5b, qwen-1.5b or a .gguf path" >&2; exit 2 ;;
esac
if [ -z "${ADDRESS:-}" ] && [ ! -f "$model_path" ]; then
  [ -n "$fetch" ] || { echo "run_intercept_bench: no model at $model_path" >&2; exit 2; }
  scripts/fetch_model.sh "$fetch"
fi
heliosd="${HELIOSD:-$root/build/heliosd}"
if [ -z "${ADDRESS:-}" ] && [ ! -x "$heliosd" ]; then
  echo "run_intercept_bench: no heliosd at $heliosd (cmake --build build --target heliosd, or HELIOSD=PATH)" >&2
  exit 2
fi

args=(--model-path "$model_path" --heliosd "$heliosd"
      --rates "${RATES:-0.25,0.5,1}"
      --policies "${POLICIES:-discard,improved-discard,preserve,swap,min-waste}"
      --n-requests "${N_REQUESTS:-30}"
      --workload "${WORKLOAD:-mixed}"
      --pause-scale "${PAUSE_SCALE:-1}"
      --kv-cache "${KV_CACHE:-128MiB}"
      --seed "${SEED:-0}")
[ -n "${MAX_CONTEXT:-}" ] && args+=(--max-context "$MAX_CONTEXT")
[ -n "${MAX_SEGMENT_TOKENS:-}" ] && args+=(--max-segment-tokens "$MAX_SEGMENT_TOKENS")
[ -n "${MAX_INTERCEPTS:-}" ] && args+=(--max-intercepts "$MAX_INTERCEPTS")
[ -n "${THREADS:-}" ] && args+=(--threads "$THREADS")
[ -n "${ADDRESS:-}" ] && args+=(--address "$ADDRESS")

# The command as the report shows it: the script with its settings.
settings="MODEL=$MODEL RATES=${RATES:-0.25,0.5,1} POLICIES=${POLICIES:-all} N_REQUESTS=${N_REQUESTS:-30}"
settings+=" WORKLOAD=${WORKLOAD:-mixed} PAUSE_SCALE=${PAUSE_SCALE:-1} KV_CACHE=${KV_CACHE:-128MiB} SEED=${SEED:-0}"
for v in MAX_CONTEXT MAX_SEGMENT_TOKENS MAX_INTERCEPTS THREADS ADDRESS; do
  [ -n "${!v:-}" ] && settings+=" $v=${!v}"
done
extra=""
[ $# -gt 0 ] && extra=" $(printf '%q ' "$@")"
export INTERCEPT_BENCH_COMMAND="$settings bench/intercept/run_intercept_bench.sh${extra% }"
exec "$PY" -m bench.intercept.run "${args[@]}" "$@"
