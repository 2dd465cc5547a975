#!/usr/bin/env bash
# Quick start: set everything up, then generate with the default model.
# Any arguments go to `helios generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- --chat --prompt "Explain in two sentences why the sky is blue."
fi
exec build/helios generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
