#!/usr/bin/env bash
# The heliosd serving benchmark in one command: output tok/s vs client concurrency (1…64) on
# SmolLM2-135M with the CPU backend, and the batching speed-up over sequential serving (c = 1),
# side by side in one run. Builds heliosd if needed, starts it on a free local port with a
# temporary config, runs bench/serve/concurrency_bench.py against it, stops it with SIGTERM.
# Writes bench/results/serve_concurrency_<date>.{json,md}.
#
# usage: bench/serve/run_concurrency_bench.sh [--threads N] [concurrency_bench.py options]
#        e.g. --levels 1,4,16 --max-tokens 64 --max-seconds 240 (see --help for all of them)
# env:   BUILD_DIR  CMake build folder (default build)
set -euo pipefail

cd "$(dirname "$0")/../.."
command_line="bench/serve/run_concurrency_bench.sh${*:+ $*}"
threads=$(nproc)
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    -h|--help)
      sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
      echo
      echo "concurrency_bench.py options (--address, --command, --out-* are set by this script):"
      /usr/bin/python3 bench/serve/concurrency_bench.py --help | sed -n '/^options:/,$p'
      exit 0 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done

BUILD_DIR="${BUILD_DIR:-build}"
PY=/usr/bin/python3
model="$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

# --- prerequisites
if ! "$PY" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "run_concurrency_bench: $PY needs grpcio and grpc_tools (apt-get install python3-grpcio python3-grpc-tools)" >&2
  exit 1
fi
if [ ! -f "$model" ]; then
  echo "run_concurrency_bench: $model is missing; fetch it with scripts/fetch_model.sh" >&2
  exit 1
fi

# --- build (always: a no-op when heliosd is up to date, and the binary then matches the commit
# recorded in the results)
step "building heliosd in $BUILD_DIR"
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" > /dev/null
else
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$BUILD_DIR" -j2 --target heliosd > /dev/null
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
[ "$build_type" = Release ] || echo "run_concurrency_bench: warning: $BUILD_DIR is a '$build_type' build, not Release" >&2

# --- config and start
date_tag=$(date -u +%Y-%m-%dT%H%MZ)
mkdir -p bench/results
work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/heliosd.yaml" <<EOF
# written by bench/serve/run_concurrency_bench.sh
server:
  listen: 127.0.0.1:0             # any free port; read back from the log
  metrics_listen: ""              # off
  drain_timeout_s: 10
models:
  - name: smollm2-135m
    path: $model
engine:
  backend: cpu
  threads: $threads
  kv_cache: 1GiB
  block_size: 16
  max_batched_tokens: 512
  max_seqs: 64
  queue_limit: 1024
  preemption: recompute
limits:
  max_tokens: 2048
  default_max_tokens: 64
  max_prompt_tokens: 4096
logging:
  level: info
  format: text
EOF
summary="cpu backend, $threads threads, max_seqs 64, max_batched_tokens 512, kv_cache 1GiB (block 16), queue_limit 1024"

step "starting heliosd ($summary)"
"$BUILD_DIR/heliosd" --config "$work/heliosd.yaml" > "$work/heliosd.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$work/heliosd.log" | head -n1)
  [ -n "$port" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "run_concurrency_bench: heliosd exited during start:" >&2
    cat "$work/heliosd.log" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "run_concurrency_bench: heliosd did not report its port within 60 s:" >&2
  cat "$work/heliosd.log" >&2
  exit 1
fi
step "heliosd pid $server_pid on 127.0.0.1:$port"

# --- run (concurrency_bench.py waits for health SERVING itself)
out="bench/results/serve_concurrency_$date_tag"
bench_rc=0
"$PY" bench/serve/concurrency_bench.py --address "127.0.0.1:$port" --command "$command_line" \
    --date "$date_tag" --server-config "$work/heliosd.yaml" --server-summary "$summary" \
    --out-json "$out.json" --out-md "$out.md" "${bench_args[@]}" || bench_rc=$?

# --- stop: SIGTERM, then up to drain_timeout_s + 20 s to exit
server_note=""
if kill -0 "$server_pid" 2>/dev/null; then
  step "stopping heliosd (SIGTERM)"
  kill -TERM "$server_pid"
  server_rc=""
  for _ in $(seq 1 300); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      server_rc=0; wait "$server_pid" || server_rc=$?
      break
    fi
    sleep 0.1
  done
  if [ -z "$server_rc" ]; then
    server_note="did not exit within 30 s of SIGTERM; killed"
    kill -KILL "$server_pid" 2>/dev/null || true
  elif [ "$server_rc" != 0 ]; then
    server_note="exited with status $server_rc after SIGTERM"
  fi
else
  server_rc=0; wait "$server_pid" || server_rc=$?
  server_note="had exited by itself during the benchmark (status $server_rc)"
fi
server_pid=""

if [ -n "$server_note" ]; then
  echo "run_concurrency_bench: heliosd $server_note; its log: $out.heliosd.log" >&2
fi
if [ -n "$server_note" ] || [ "$bench_rc" != 0 ]; then
  cp "$work/heliosd.log" "$out.heliosd.log"
fi
if [ -n "$server_note" ] && [ -f "$out.json" ]; then
  "$PY" - "$out.json" "$out.md" "$server_note" <<'EOF'
import json, sys
path, md, note = sys.argv[1:4]
with open(path) as f:
    report = json.load(f)
report["server_exit"] = note
with open(path, "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")
with open(md, "a") as f:
    f.write(f"\n**heliosd {note}** (its log is next to this file, .heliosd.log).\n")
EOF
fi
if [ -f "$out.json" ]; then step "wrote $out.json and $out.md"; fi
exit "$bench_rc"
