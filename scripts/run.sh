#!/usr/bin/env bash
# Quick start: set everything up, then run heliosd on the default configuration
# (configs/default.yaml: SmolLM2-135M on the CPU, gRPC on port 50051, metrics on 127.0.0.1:9090).
# Any arguments go to heliosd instead (e.g. --config configs/cpu-dev.yaml).
# Try it from another terminal:  build/helios complete --prompt "Once upon a time"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- --config configs/default.yaml
fi
exec build/heliosd "$@"
