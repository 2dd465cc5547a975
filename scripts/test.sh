#!/usr/bin/env bash
# Sets up, runs the whole test suite (unit, golden, e2e; gpu tests skip without a GPU), then, when
# nvcc is found, builds the CUDA configuration in ./build-cuda and runs its GPU tests there (they
# skip, saying so, on a machine without a GPU: the step proves the CUDA code compiles and links).
# Extra arguments go to the first ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
(cd build && ctest --output-on-failure --timeout 900 -j2 "$@") || status=$?

NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [ -z "$NVCC" ]; then
  echo "test.sh: nvcc not found (PATH, /usr/local/cuda/bin): CUDA build skipped"
  exit $status
fi
echo "test.sh: CUDA build in ./build-cuda with $NVCC (log: build-cuda.log)"
start=$(date +%s)
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DHELIOS_CUDA=ON -DHELIOS_TESTS=ON \
      -DCMAKE_CUDA_COMPILER="$NVCC" > build-cuda.log 2>&1 || {
  tail -n 30 build-cuda.log >&2; echo "test.sh: CUDA configure failed (build-cuda.log)" >&2; exit 1; }
# The targets that hold CUDA code or link it: the GPU tests, the programs, the GPU benchmark.
targets="helios_gpu_tests helios helios-bench-gpu"
if cmake --build build-cuda --target help 2>/dev/null | grep -q '\bheliosd\b'; then targets="$targets heliosd"; fi
cmake --build build-cuda -j"$(nproc)" --target $targets >> build-cuda.log 2>&1 || {
  tail -n 60 build-cuda.log >&2; echo "test.sh: CUDA build failed (build-cuda.log)" >&2; exit 1; }
(cd build-cuda && ctest -L gpu --output-on-failure --timeout 600) || status=$?
echo "test.sh: CUDA build and GPU tests took $(( $(date +%s) - start )) s"
exit $status
