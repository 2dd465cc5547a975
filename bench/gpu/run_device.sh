#!/usr/bin/env bash
# One run on a GPU machine (made for a fresh H200, at most ~8 minutes, no package registry):
# builds the CUDA configuration, runs the GPU tests, then the GPU benchmarks, writing everything
# into RESULTS_DIR. A step that cannot run says why in its log and the run goes on.
#
#   bench/gpu/run_device.sh RESULTS_DIR
#
# RESULTS_DIR/
#   run_device.log              what ran, for how long, and every skip with its reason
#   configure.log, build.log    cmake output
#   gpu_tests.log, gpu_tests.xml   ctest -L gpu (JUnit)
#   decode_7b_f16.{log,json}    a Llama-2-7B-shaped F16 model: (a) batch-1 decode tok/s and its
#                               share of the HBM roofline, (c) decode tok/s against batch size
#   decode_1b_q4km.{log,json}   (a') a 1B-shaped Q4_K_M model: decode from the GGUF blocks
#   attention_helios_f16.{log,json}   (b) with an f16 KV cache
#   attention_helios.{log,json}, attention.{md,json}   (b) paged-attention GB/s, Helios vs torch SDPA
#   e2e_<model>.{log,json}      (d) SmolLM2 (or stories260K when SmolLM2 is absent): GPU vs CPU
#   summary.md                  the headline numbers
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${1:?usage: bench/gpu/run_device.sh RESULTS_DIR}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
BUILD=build-device
MODELS=models
START=$(date +%s)
log() { echo "[run_device +$(( $(date +%s) - START ))s] $*" | tee -a "$RESULTS/run_device.log"; }

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then log "nvcc not found (PATH, /usr/local/cuda/bin): nothing to build"; exit 1; fi
export PATH="$(dirname "$NVCC"):$PATH"
nvidia-smi > "$RESULTS/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"
# The compute capability picks the one architecture to build (halves the CUDA compile time).
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
[ -z "$ARCH" ] && ARCH=90
log "nvcc $NVCC, sm_$ARCH, $(nproc) cores"

# --- build
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DHELIOS_CUDA=ON -DHELIOS_TESTS=ON \
     -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$RESULTS/configure.log" 2>&1; then
  log "configure failed: the last lines of configure.log name the missing package"; tail -n 20 "$RESULTS/configure.log"; exit 1
fi
if ! cmake --build "$BUILD" -j"$(nproc)" --target helios_gpu_tests helios helios-bench-gpu > "$RESULTS/build.log" 2>&1; then
  log "build failed (end of build.log below)"; tail -n 40 "$RESULTS/build.log"; exit 1
fi
log "built"
HELIOS="$BUILD/helios"
BENCH="$BUILD/bench/helios-bench-gpu"

# stories260K for the forward-pass test: the models cache, else converted from tests/data.
mkdir -p "$MODELS"
if [ ! -f "$MODELS/stories260K.gguf" ]; then
  "$HELIOS" convert-llama2c --checkpoint tests/data/stories260K/stories260K.bin \
    --tokenizer tests/data/stories260K/tok512.bin --out "$MODELS/stories260K.gguf" >> "$RESULTS/run_device.log" 2>&1
fi
[ -f "$MODELS/stories260K.gguf" ] || log "stories260K.gguf absent: the forward-pass test will skip"

# --- GPU tests
(cd "$BUILD" && timeout 240 ctest -L gpu --output-on-failure --output-junit "$RESULTS/gpu_tests.xml") \
  > "$RESULTS/gpu_tests.log" 2>&1
log "gpu tests: $(grep -E 'tests passed|tests failed' "$RESULTS/gpu_tests.log" | tail -n1)"

# --- (a) and (c): a Llama-2-7B-shaped F16 model (13.5 GB of weights), written once
SYN="$MODELS/synthetic-7b-f16.gguf"
if [ ! -f "$SYN" ]; then
  timeout 240 "$HELIOS" make-synthetic --preset 7b --type F16 --untied --out "$SYN" > "$RESULTS/make_synthetic.log" 2>&1 \
    || { log "make-synthetic failed or timed out (make_synthetic.log)"; rm -f "$SYN"; }
  log "synthetic 7B written"
fi
if [ -f "$SYN" ]; then
  # One load for both: batch 1 gives (a) with its roofline share, the other batch sizes (c).
  timeout 200 "$BENCH" decode --model "$SYN" --batch 1,2,4,8,16,32,64 --prompt-tokens 128 --decode-tokens 64 \
    --bandwidth-gbs 4800 --json "$RESULTS/decode_7b_f16.json" > "$RESULTS/decode_7b_f16.log" 2>&1
  log "(a, c) decode exit $?: $(grep -E '^1 ' "$RESULTS/decode_7b_f16.log")"
fi

# --- (a') a Llama-3.2-1B-shaped Q4_K_M model (~0.7 GB, quick to write): decode reads the GGUF blocks, against their own roofline
SYNQ="$MODELS/synthetic-1b-q4km.gguf"
if [ ! -f "$SYNQ" ]; then
  timeout 120 "$HELIOS" make-synthetic --preset 1b --type Q4_K_M --untied --out "$SYNQ" > "$RESULTS/make_synthetic_q4km.log" 2>&1 \
    || { log "make-synthetic Q4_K_M failed or timed out (make_synthetic_q4km.log)"; rm -f "$SYNQ"; }
fi
if [ -f "$SYNQ" ]; then
  timeout 150 "$BENCH" decode --model "$SYNQ" --batch 1,8,32 --prompt-tokens 128 --decode-tokens 64 \
    --bandwidth-gbs 4800 --json "$RESULTS/decode_1b_q4km.json" > "$RESULTS/decode_1b_q4km.log" 2>&1
  log "(a') Q4_K_M decode exit $?: $(grep -E '^1 ' "$RESULTS/decode_1b_q4km.log")"
fi

# --- (b) paged attention: Helios' kernel (f32 and f16 caches), then torch SDPA on the same shapes
timeout 60 "$BENCH" attention --batch 1,8,32 --context 512,4096,16384 --heads 32 --kv-heads 8 --head-dim 128 \
  --json "$RESULTS/attention_helios.json" > "$RESULTS/attention_helios.log" 2>&1
log "(b) helios attention done (exit $?)"
timeout 60 "$BENCH" attention --batch 1,8,32 --context 512,4096,16384 --heads 32 --kv-heads 8 --head-dim 128 \
  --kv-type f16 --json "$RESULTS/attention_helios_f16.json" > "$RESULTS/attention_helios_f16.log" 2>&1
log "(b) helios attention, f16 cache, done (exit $?)"
if [ -f "$RESULTS/attention_helios.json" ]; then
  timeout 90 python3 bench/gpu/attention_torch.py --helios-json "$RESULTS/attention_helios.json" \
    --json "$RESULTS/attention.json" --md "$RESULTS/attention.md" > "$RESULTS/attention_torch.log" 2>&1
  log "(b) torch: $(head -n1 "$RESULTS/attention_torch.log")"
fi

# --- (d) a real model end to end, GPU vs CPU
E2E="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$E2E" ]; then
  log "(d) $E2E absent (scripts/fetch_model.sh needs PyPI): using stories260K instead"
  E2E="$MODELS/stories260K.gguf"
fi
if [ -f "$E2E" ]; then
  name=$(basename "$E2E" .gguf)
  timeout 120 "$BENCH" compare --model "$E2E" --prompt-tokens 128 --decode-tokens 64 \
    --json "$RESULTS/e2e_$name.json" > "$RESULTS/e2e_$name.log" 2>&1
  log "(d) $name: $(tr '\n' ' ' < "$RESULTS/e2e_$name.log" | tail -c 300)"
fi

# --- summary
{
  echo "# CUDA backend on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
  echo
  echo "## GPU tests"; echo; echo '```'; grep -E 'tests passed|tests failed|Failed|\*\*\*' "$RESULTS/gpu_tests.log"; echo '```'
  for f in decode_7b_f16 decode_1b_q4km attention_helios attention_helios_f16; do
    [ -f "$RESULTS/$f.log" ] && { echo; echo "## $f"; echo; echo '```'; cat "$RESULTS/$f.log"; echo '```'; }
  done
  [ -f "$RESULTS/attention.md" ] && { echo; cat "$RESULTS/attention.md"; }
  for f in "$RESULTS"/e2e_*.log; do
    [ -f "$f" ] && { echo; echo "## $(basename "$f" .log)"; echo; echo '```'; cat "$f"; echo '```'; }
  done
  echo; echo "Total time: $(( $(date +%s) - START )) s"
} > "$RESULTS/summary.md"
log "done: $RESULTS/summary.md"
