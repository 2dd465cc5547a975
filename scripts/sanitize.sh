#!/usr/bin/env bash
# scripts/sanitize.sh asan|tsan [unit|golden|integration|e2e|all] [CTEST_ARGS...]
#
# Builds the tests with gcc and a sanitizer, and runs the chosen ctest labels there:
#   asan  ./build-asan: AddressSanitizer (leaks too) + UndefinedBehaviorSanitizer, which stops the
#         test at the first report
#   tsan  ./build-tsan: ThreadSanitizer
# Suites (default unit): unit (label unit), golden, integration (the in-process gRPC server tests:
# label e2e without the e2e.* and bench.* scripts), e2e (label e2e: those and the scripts driving
# the real programs), all (unit, golden and e2e). Only what the suite runs is built. Suppressions,
# each with its reason, are in tests/sanitizers/. Ends with ctest's summary; non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/sanitize.sh asan|tsan [unit|golden|integration|e2e|all] [CTEST_ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
kind=$1
suite=${2:-unit}
shift $(( $# >= 2 ? 2 : 1 ))
case "$kind" in asan|tsan) ;; *) usage ;; esac

case "$suite" in
  unit)        targets=(helios_unit_tests);   select=(-L unit) ;;
  golden)      targets=(helios_golden_tests); select=(-L golden) ;;
  integration) targets=(helios_server_tests); select=(-L e2e -E '^(e2e|bench)\.') ;;
  e2e)         targets=(helios heliosd helios_server_tests); select=(-L e2e) ;;
  all)         targets=(helios heliosd helios_unit_tests helios_golden_tests helios_server_tests)
               select=(-L '^(unit|golden|e2e)$') ;;
  *) usage ;;
esac

build=build-$kind
log=$build.log
supp=$PWD/tests/sanitizers
# The build runs the test programs too (gtest discovery), so the options hold for it as well.
if [ "$kind" = asan ]; then
  export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:${ASAN_OPTIONS:-}"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp:${UBSAN_OPTIONS:-}"
else
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:${TSAN_OPTIONS:-}"
fi

echo "sanitize.sh: building ${targets[*]} in ./$build (gcc, $kind; log: $log)"
start=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  if ! CC=gcc CXX=g++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DHELIOS_SANITIZE="$kind" \
        -DHELIOS_TESTS=ON > "$log" 2>&1; then
    tail -n 30 "$log"; echo "sanitize.sh: configure failed ($log)"; exit 1
  fi
fi
if ! cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >> "$log" 2>&1; then
  tail -n 60 "$log"; echo "sanitize.sh: build failed ($log)"; exit 1
fi
echo "sanitize.sh: built in $(( $(date +%s) - start )) s; running ctest ${select[*]} $*"
cd "$build"
# Sanitizers make the tests a few times slower than in Release.
exec ctest --output-on-failure --timeout 1800 "${select[@]}" "$@"
