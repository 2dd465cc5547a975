#!/usr/bin/env bash
# Sets up a fresh machine: Debian packages, the default model, a Release build in ./build.
# Safe to run again: every step skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
scripts/fetch_model.sh
echo "setup: building (Release) in ./build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${HELIOS_CMAKE_ARGS:-} > build.log 2>&1 || {
  cat build.log >&2; echo "setup: cmake configure failed (log above)" >&2; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 || {
  tail -n 60 build.log >&2; echo "setup: build failed (end of build.log above)" >&2; exit 1; }
echo "setup: done (build log: build.log)"
