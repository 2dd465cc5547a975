#!/usr/bin/env bash
# One run on a GPU machine (made for a fresh H100 or H200, at most ~8 minutes, no package
# registry): runs the GPU tests, then the GPU benchmarks, writing everything into RESULTS_DIR. A
# step that cannot run says why in its log and the run goes on.
#
#   bench/gpu/run_device.sh RESULTS_DIR [ARCHIVE.tar.gz]
#
# The whole run keeps within HELIOS_DEVICE_BUDGET_S seconds (default 540, inside a device call's
# 600): each step's timeout is cut to the time left, and a step with none left is skipped, saying
# so. Steps run most telling first: the GPU tests, attention, the matmul kernels alone, a real
# model end to end, the 1B
# Q4_K_M decode, then the 7B F16 decode (its 13.5 GB model is written first). With ARCHIVE,
# RESULTS_DIR is packed into it after every step, so a run cut off midway still returns one file
# with all it did (device calls bring back at most 8 files).
#
# The programs come from .device/bundle.tar.xz when it is there (bench/gpu/pack_device.sh builds
# it on a machine with the CPU build's libraries; the GPU machines have only the CUDA toolkit) and
# runs there; otherwise the CUDA configuration is built here, in build-device/.
#
# RESULTS_DIR/
#   run_device.log              what ran, for how long, and every skip with its reason
#   bundle.log | configure.log, build.log   the bundle's manifest and first run, or cmake output
#   bundle_sources.log          the source files that differ from the bundle's, if any
#   gpu_tests.log, gpu_tests.xml   the GPU tests (JUnit)
#   sanitizer.log               the failed GPU tests again under compute-sanitizer memcheck
#   decode_7b_f16.{log,json}    a Llama-2-7B-shaped F16 model: (a) batch-1 decode tok/s and its
#                               share of the HBM roofline, (c) decode tok/s against batch size
#   decode_1b_q4km.{log,json}   (a') a 1B-shaped Q4_K_M model: decode from the GGUF blocks
#   attention_helios_f16.{log,json}   (b) with an f16 KV cache
#   attention_helios.{log,json}, attention.{md,json}   (b) paged-attention GB/s, Helios vs torch SDPA
#   gemv.{log,json}             the decode matmul kernels alone: GB/s and roofline share per weight
#                               type and row count on a 7B layer's shapes (where (a) and (a') go)
#   e2e_<model>.{log,json}      (d) SmolLM2 (or stories260K when SmolLM2 is absent): GPU vs CPU
#   summary.md                  the headline numbers
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${1:?usage: bench/gpu/run_device.sh RESULTS_DIR [ARCHIVE.tar.gz]}
ARCHIVE=${2:-}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
[ -n "$ARCHIVE" ] && ARCHIVE=$(cd "$(dirname "$ARCHIVE")" && pwd)/$(basename "$ARCHIVE")
BUILD=build-device
MODELS=models
STALE=""  # why the bundle's programs are not this tree's, when they are not
START=$(date +%s)
DEADLINE=$((START + ${HELIOS_DEVICE_BUDGET_S:-540}))
log() { echo "[run_device +$(( $(date +%s) - START ))s] $*" | tee -a "$RESULTS/run_device.log"; }

# timed LIMIT_S CMD...: CMD under timeout, LIMIT_S cut to the time left before the deadline (less
# 15 s for the summary); exit 124 without running it when under 10 s are left.
timed() {
  local want=$1 left
  shift
  left=$((DEADLINE - $(date +%s) - 15))
  if [ "$left" -lt 10 ]; then log "skipped, no time left: $(basename "$1") ${2:-}"; return 124; fi
  timeout "$(( want < left ? want : left ))" "$@"
}

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ]; then export PATH="$(dirname "$NVCC"):$PATH"; else log "nvcc not found (PATH, /usr/local/cuda/bin): only a bundle can run"; fi
nvidia-smi > "$RESULTS/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"
# The compute capability picks the one architecture to build (halves the CUDA compile time).
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
[ -z "$ARCH" ] && ARCH=90
log "nvcc ${NVCC:-none}, sm_$ARCH, $(nproc) cores"

# The HBM bandwidth the roofline shares are taken against, from the GPU's name (GB/s).
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
case "$GPU_NAME" in
  *H200*) BANDWIDTH=4800 ;;
  *H100*PCIe*) BANDWIDTH=2000 ;;
  *H100*NVL*) BANDWIDTH=3900 ;;
  *H100*) BANDWIDTH=3350 ;;
  *A100*80GB*) BANDWIDTH=2039 ;;
  *A100*) BANDWIDTH=1555 ;;
  *) BANDWIDTH=4800; log "unknown GPU '$GPU_NAME': roofline shares assume 4800 GB/s" ;;
esac
log "${GPU_NAME:-no GPU name}: roofline at $BANDWIDTH GB/s"

# --- the programs: the bundle if it runs here, else a build
BUNDLE=.device/bundle.tar.xz
BUNDLE_DIR=/tmp/helios-bundle

# The directories holding this machine's CUDA libraries: the toolkit's and pip's nvidia packages.
cuda_library_path() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64)
  local site
  for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    dirs+=("$site"/nvidia/*/lib "$site"/nvidia/cu13/lib)
  done
  local d path="" lib found
  for d in "${dirs[@]}"; do [ -d "$d" ] && path="$path${path:+:}$d"; done
  # Anything still missing: wherever the image keeps it.
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    for d in ${path//:/ }; do [ -e "$d/$lib" ] && found=1 && break; done
    [ -n "$found" ] && continue
    d=$(find /usr /opt -name "$lib" -print -quit 2>/dev/null)
    [ -n "$d" ] && path="$path${path:+:}$(dirname "$d")"
  done
  echo "$path"
}

# Wrappers in $BUNDLE_DIR/run that start each program with this machine's glibc, or with the
# bundle's loader and C library (how: direct | loader).
write_wrappers() {
  local how=$1 cuda_path=$2 tool
  mkdir -p "$BUNDLE_DIR/run"
  for tool in helios helios-bench-gpu helios_gpu_tests; do
    if [ "$how" = direct ]; then
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/lib:%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/bin/%s" "$@"\n' \
        "$BUNDLE_DIR" "$cuda_path" "$BUNDLE_DIR" "$tool" > "$BUNDLE_DIR/run/$tool"
    else
      printf '#!/bin/sh\nexec "%s/glibc/ld-linux-x86-64.so.2" --library-path "%s/glibc:%s/lib:%s" "%s/bin/%s" "$@"\n' \
        "$BUNDLE_DIR" "$BUNDLE_DIR" "$BUNDLE_DIR" "$cuda_path" "$BUNDLE_DIR" "$tool" > "$BUNDLE_DIR/run/$tool"
    fi
    chmod +x "$BUNDLE_DIR/run/$tool"
  done
}

use_bundle() {
  [ -f "$BUNDLE" ] || { log "no $BUNDLE (bench/gpu/pack_device.sh makes it): building here"; return 1; }
  rm -rf "$BUNDLE_DIR" && mkdir -p "$BUNDLE_DIR"
  tar -C "$BUNDLE_DIR" -xJf "$BUNDLE" || { log "$BUNDLE does not unpack: building here"; return 1; }
  cat "$BUNDLE_DIR/MANIFEST" > "$RESULTS/bundle.log"
  # A bundle packed from other sources still runs, but its figures are not this tree's: say so in
  # the log and at the top of the summary.
  if [ ! -f "$BUNDLE_DIR/SOURCES" ]; then
    STALE="the bundle records no sources (packed by an older pack_device.sh)"
  elif ! (sha256sum -c --quiet "$BUNDLE_DIR/SOURCES" > "$RESULTS/bundle_sources.log" 2>&1); then
    STALE="the bundle was built from other sources than this tree ($(grep -c 'FAILED' "$RESULTS/bundle_sources.log") files differ: bundle_sources.log); repack with bench/gpu/pack_device.sh"
  fi
  [ -n "$STALE" ] && log "WARNING: $STALE"
  local arch
  arch=$(awk '$1 == "arch" {print $2}' "$BUNDLE_DIR/MANIFEST")
  [ "$arch" = "$ARCH" ] || { log "the bundle is built for sm_$arch, this GPU is sm_$ARCH: building here"; return 1; }
  local cuda_path how
  cuda_path=$(cuda_library_path)
  echo "CUDA libraries from: $cuda_path" >> "$RESULTS/bundle.log"
  for how in direct loader; do
    write_wrappers "$how" "$cuda_path"
    echo "--- $how: helios_gpu_tests --gtest_list_tests" >> "$RESULTS/bundle.log"
    if "$BUNDLE_DIR/run/helios_gpu_tests" --gtest_list_tests > /dev/null 2>> "$RESULTS/bundle.log" &&
       "$BUNDLE_DIR/run/helios-bench-gpu" --help > /dev/null 2>> "$RESULTS/bundle.log"; then
      log "bundle ($(head -n1 "$BUNDLE_DIR/MANIFEST")) runs here ($how)"
      return 0
    fi
  done
  log "the bundle does not start here (bundle.log says why): building here"
  return 1
}

build_here() {
  [ -n "$NVCC" ] || { log "no nvcc to build with"; return 1; }
  if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DHELIOS_CUDA=ON -DHELIOS_TESTS=ON \
       -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$RESULTS/configure.log" 2>&1; then
    log "configure failed: the last lines of configure.log name the missing package"; tail -n 20 "$RESULTS/configure.log"; return 1
  fi
  if ! cmake --build "$BUILD" -j"$(nproc)" --target helios_gpu_tests helios helios-bench-gpu > "$RESULTS/build.log" 2>&1; then
    log "build failed (end of build.log below)"; tail -n 40 "$RESULTS/build.log"; return 1
  fi
  log "built"
}

if use_bundle; then
  HELIOS="$BUNDLE_DIR/run/helios"
  BENCH="$BUNDLE_DIR/run/helios-bench-gpu"
  GPU_TESTS="$BUNDLE_DIR/run/helios_gpu_tests"
else
  build_here || exit 1
  HELIOS="$BUILD/helios"
  BENCH="$BUILD/bench/helios-bench-gpu"
  GPU_TESTS="$BUILD/tests/helios_gpu_tests"
fi

# The headline numbers, rewritten after every step; with ARCHIVE, everything packed into it too.
summarize() {
  {
    echo "# CUDA backend on ${GPU_NAME:-an unnamed GPU} (roofline at $BANDWIDTH GB/s)"
    echo
    [ -f "$RESULTS/bundle.log" ] && echo "Programs: the bundle, $(head -n1 "$RESULTS/bundle.log")."
    [ -n "$STALE" ] && echo "**Not this tree's figures: $STALE.**"
    [ -f "$RESULTS/build.log" ] && echo "Programs: built on this machine at $(git rev-parse HEAD 2>/dev/null)."
    echo
    echo "## GPU tests"; echo; echo '```'
    grep -E '^\[  (PASSED  |SKIPPED )\] [0-9]+ test|^\[  FAILED  \]' "$RESULTS/gpu_tests.log" 2>/dev/null; echo '```'
    local f
    for f in attention_helios attention_helios_f16 gemv decode_1b_q4km decode_7b_f16; do
      [ -f "$RESULTS/$f.log" ] && { echo; echo "## $f"; echo; echo '```'; cat "$RESULTS/$f.log"; echo '```'; }
    done
    [ -f "$RESULTS/attention.md" ] && { echo; cat "$RESULTS/attention.md"; }
    for f in "$RESULTS"/e2e_*.log; do
      [ -f "$f" ] && { echo; echo "## $(basename "$f" .log)"; echo; echo '```'; cat "$f"; echo '```'; }
    done
    echo; echo "Time so far: $(( $(date +%s) - START )) s"
  } > "$RESULTS/summary.md"
  if [ -n "$ARCHIVE" ]; then tar -C "$RESULTS" -czf "$ARCHIVE.tmp" . && mv "$ARCHIVE.tmp" "$ARCHIVE"; fi
}

# stories260K for the benchmarks' end-to-end run: the models cache, else converted from tests/data.
mkdir -p "$MODELS"
if [ ! -f "$MODELS/stories260K.gguf" ]; then
  "$HELIOS" convert-llama2c --checkpoint tests/data/stories260K/stories260K.bin \
    --tokenizer tests/data/stories260K/tok512.bin --out "$MODELS/stories260K.gguf" >> "$RESULTS/run_device.log" 2>&1
fi
[ -f "$MODELS/stories260K.gguf" ] || log "stories260K.gguf could not be converted (run_device.log)"

# --- GPU tests: the test binary itself (ctest's files name the tree they were configured in),
# pointed at this checkout's tests/data and models/.
HELIOS_SOURCE_DIR="$PWD" timed 300 "$GPU_TESTS" --gtest_output="xml:$RESULTS/gpu_tests.xml" \
  > "$RESULTS/gpu_tests.log" 2>&1
log "gpu tests (exit $?): $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$RESULTS/gpu_tests.log" | tr '\n' ' ')"
# Failed tests once more under compute-sanitizer's memcheck (where the runtime lets it read the
# device): the out-of-bounds access or API error behind a failure, named with its kernel.
FAILED=$(grep -E '^\[  FAILED  \] [A-Za-z_]' "$RESULTS/gpu_tests.log" | awk '{print $4}' | sort -u | paste -sd: -)
if [ -n "$FAILED" ] && command -v compute-sanitizer > /dev/null; then
  HELIOS_SOURCE_DIR="$PWD" timed 120 compute-sanitizer --tool memcheck --print-limit 20 \
    "$GPU_TESTS" --gtest_filter="$FAILED" > "$RESULTS/sanitizer.log" 2>&1
  log "memcheck of the failed tests (exit $?): $(grep -E 'ERROR SUMMARY' "$RESULTS/sanitizer.log" | tail -n1)"
fi
summarize

# --- (b) paged attention: Helios' kernel (f32 and f16 caches), then torch SDPA on the same shapes
timed 60 "$BENCH" attention --batch 1,8,32 --context 512,4096,16384 --heads 32 --kv-heads 8 --head-dim 128 \
  --json "$RESULTS/attention_helios.json" > "$RESULTS/attention_helios.log" 2>&1
log "(b) helios attention done (exit $?)"
timed 60 "$BENCH" attention --batch 1,8,32 --context 512,4096,16384 --heads 32 --kv-heads 8 --head-dim 128 \
  --kv-type f16 --json "$RESULTS/attention_helios_f16.json" > "$RESULTS/attention_helios_f16.log" 2>&1
log "(b) helios attention, f16 cache, done (exit $?)"
if [ -f "$RESULTS/attention_helios.json" ]; then
  timed 90 python3 bench/gpu/attention_torch.py --helios-json "$RESULTS/attention_helios.json" \
    --json "$RESULTS/attention.json" --md "$RESULTS/attention.md" > "$RESULTS/attention_torch.log" 2>&1
  log "(b) torch: $(head -n1 "$RESULTS/attention_torch.log")"
fi
summarize

# --- the decode matmul kernels alone: what share of the roofline each weight type reaches
timed 90 "$BENCH" gemv --batch 1,2,4,8,16,32,64 --bandwidth-gbs "$BANDWIDTH" --json "$RESULTS/gemv.json" \
  > "$RESULTS/gemv.log" 2>&1
log "gemv done (exit $?)"
summarize

# --- (d) a real model end to end, GPU vs CPU
E2E="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$E2E" ]; then
  log "(d) $E2E absent (scripts/fetch_model.sh needs PyPI): using stories260K instead"
  E2E="$MODELS/stories260K.gguf"
fi
if [ -f "$E2E" ]; then
  name=$(basename "$E2E" .gguf)
  timed 120 "$BENCH" compare --model "$E2E" --prompt-tokens 128 --decode-tokens 64 \
    --json "$RESULTS/e2e_$name.json" > "$RESULTS/e2e_$name.log" 2>&1
  log "(d) $name: $(tr '\n' ' ' < "$RESULTS/e2e_$name.log" | tail -c 300)"
fi
summarize

# --- (a') a Llama-3.2-1B-shaped Q4_K_M model (~0.7 GB, quick to write): decode reads the GGUF
# blocks, against their own roofline
SYNQ="$MODELS/synthetic-1b-q4km.gguf"
if [ ! -f "$SYNQ" ]; then
  timed 120 "$HELIOS" make-synthetic --preset 1b --type Q4_K_M --untied --out "$SYNQ" > "$RESULTS/make_synthetic_q4km.log" 2>&1 \
    || { log "make-synthetic Q4_K_M failed or timed out (make_synthetic_q4km.log)"; rm -f "$SYNQ"; }
fi
if [ -f "$SYNQ" ]; then
  timed 150 "$BENCH" decode --model "$SYNQ" --batch 1,8,32 --prompt-tokens 128 --decode-tokens 64 \
    --bandwidth-gbs "$BANDWIDTH" --json "$RESULTS/decode_1b_q4km.json" > "$RESULTS/decode_1b_q4km.log" 2>&1
  log "(a') Q4_K_M decode exit $?: $(grep -E '^1 ' "$RESULTS/decode_1b_q4km.log")"
fi
summarize

# --- (a) and (c): a Llama-2-7B-shaped F16 model (13.5 GB of weights), written once
SYN="$MODELS/synthetic-7b-f16.gguf"
if [ ! -f "$SYN" ]; then
  if timed 240 "$HELIOS" make-synthetic --preset 7b --type F16 --untied --out "$SYN" > "$RESULTS/make_synthetic.log" 2>&1; then
    log "synthetic 7B written"
  else
    log "make-synthetic failed or timed out (make_synthetic.log)"; rm -f "$SYN"
  fi
fi
if [ -f "$SYN" ]; then
  # One load for both: batch 1 gives (a) with its roofline share, the other batch sizes (c).
  timed 200 "$BENCH" decode --model "$SYN" --batch 1,2,4,8,16,32,64 --prompt-tokens 128 --decode-tokens 64 \
    --bandwidth-gbs "$BANDWIDTH" --json "$RESULTS/decode_7b_f16.json" > "$RESULTS/decode_7b_f16.log" 2>&1
  log "(a, c) decode exit $?: $(grep -E '^1 ' "$RESULTS/decode_7b_f16.log")"
fi
summarize
log "done: $RESULTS/summary.md${ARCHIVE:+ and $ARCHIVE}"
