#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (unit, golden, e2e; gpu tests skip without
# a GPU). Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure --timeout 900 -j2 "$@"
