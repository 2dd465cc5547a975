#!/usr/bin/env bash
# Sets up; when nvcc is found, builds the CUDA configuration in ./build-cuda and runs its GPU tests
# there (they skip, saying so, on a machine without a GPU: the step proves the CUDA code compiles and
# links); runs every libFuzzer target for 12 s (scripts/fuzz.sh in ./build-fuzz: one test per
# target) and the unit tests under ASan + UBSan (scripts/sanitize.sh asan unit in ./build-asan);
# then runs the whole test suite (unit, golden, e2e). Extra arguments go to that suite's ctest
# (e.g. -L unit). The last line sums every run,
#   test.sh: 812 passed, 0 failed, 23 skipped (ctest: build-cuda, build-asan, build; fuzz.sh: build-fuzz)
# and the exit status is non-zero when anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The test venv (.venv-test: the pinned openai client for tests/e2e/server/test_openai.py). Without
# it that module fails, saying how to make it; the rest of the suite runs either way.
scripts/setup_venv.sh > /dev/null ||
  echo "test.sh: scripts/setup_venv.sh failed (above): e2e.heliosd's test_openai will fail until it succeeds"
passed=0 failed=0 skipped=0 runs="" fuzz_runs="" notes=""

# run_ctest DIR ARGS...: ctest in DIR; the counts of its closing summary join the totals.
run_ctest() {
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$dir/ctest.log" || true
  count_ctest_log "$dir" "$dir/ctest.log"
}
# count_ctest_log DIR LOG: the counts of the ctest summary in LOG join the totals (ctest counts
# skipped tests as passed, so they come off the passed count).
count_ctest_log() {
  local dir=$1 log=$2 total fail skip disabled
  runs="${runs:+$runs, }$dir"
  read -r fail total < <(sed -n 's/.* \([0-9][0-9]*\) tests failed out of \([0-9][0-9]*\)$/\1 \2/p' "$log") || {
    echo "test.sh: ctest in $dir ended without a summary ($log)"; failed=$((failed + 1)); return; }
  skip=$(grep -cE '^\s+[0-9]+ - .* \(Skipped\)$' "$log" || true)
  disabled=$(grep -cE '^\s+[0-9]+ - .* \(Disabled\)$' "$log" || true)  # not in the total
  passed=$((passed + total - fail - skip)) failed=$((failed + fail)) skipped=$((skipped + skip + disabled))
}
summary() {
  echo "test.sh: $passed passed, $failed failed, $skipped skipped (ctest: $runs${fuzz_runs:+; fuzz.sh: $fuzz_runs})$*"
  [ "$failed" -eq 0 ]
}

# cuda_build_and_test: the CUDA configuration in ./build-cuda and its GPU tests (they skip, saying
# so, without a GPU). It runs first so that the suite's own ctest summary closes the output.
cuda_build_and_test() {
  local nvcc start targets
  nvcc=$(command -v nvcc || true)
  if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  if [ -z "$nvcc" ]; then
    echo "test.sh: nvcc not found (PATH, /usr/local/cuda/bin): CUDA build skipped"
    return
  fi
  echo "test.sh: CUDA build in ./build-cuda with $nvcc (log: build-cuda.log)"
  start=$(date +%s)
  if ! cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DHELIOS_CUDA=ON -DHELIOS_TESTS=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" > build-cuda.log 2>&1; then
    tail -n 30 build-cuda.log; failed=$((failed + 1)); notes="; CUDA configure failed (build-cuda.log)"
    return
  fi
  # The targets that hold CUDA code or link it: the GPU tests, the programs, the GPU benchmark.
  targets="helios_gpu_tests helios helios-bench-gpu"
  if cmake --build build-cuda --target help 2>/dev/null | grep -q '\bheliosd\b'; then targets="$targets heliosd"; fi
  if ! cmake --build build-cuda -j"$(nproc)" --target $targets >> build-cuda.log 2>&1; then
    tail -n 60 build-cuda.log; failed=$((failed + 1)); notes="; CUDA build failed (build-cuda.log)"
    return
  fi
  run_ctest build-cuda -L gpu --timeout 600
  echo "test.sh: CUDA build and GPU tests took $(( $(date +%s) - start )) s"
}

# fuzz_smoke: every libFuzzer target for 12 s on its seed corpus (scripts/fuzz.sh, ./build-fuzz):
# one test per target, passed unless it crashed, leaked, hung or ran out of memory.
fuzz_smoke() {
  local log=build-fuzz.smoke.log start pass fail
  start=$(date +%s)
  scripts/fuzz.sh 12 2>&1 | tee "$log" || true
  pass=$(grep -cE '^fuzz.sh: fuzz_[a-z_]+: passed' "$log" || true)
  fail=$(grep -cE '^fuzz.sh: fuzz_[a-z_]+: failed' "$log" || true)
  fuzz_runs=build-fuzz
  if [ $((pass + fail)) -eq 0 ]; then
    echo "test.sh: scripts/fuzz.sh gave no per-target results ($log)"; failed=$((failed + 1)); return
  fi
  passed=$((passed + pass)) failed=$((failed + fail))
  echo "test.sh: fuzz smoke (build and $((pass + fail)) targets) took $(( $(date +%s) - start )) s"
}

# asan_unit: the unit tests built with ASan + UBSan (scripts/sanitize.sh asan unit, ./build-asan).
asan_unit() {
  local log=build-asan.ctest.log start
  start=$(date +%s)
  scripts/sanitize.sh asan unit -j2 2>&1 | tee "$log" || true
  count_ctest_log build-asan "$log"
  echo "test.sh: ASan + UBSan unit tests (build and run) took $(( $(date +%s) - start )) s"
}

cuda_build_and_test
fuzz_smoke
asan_unit
run_ctest build --timeout 900 -j2 "$@"
summary "$notes"
