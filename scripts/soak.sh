#!/usr/bin/env bash
# Long soak run of heliosd (tests/soak/soak.py): mixed traffic for hours, then the leak and
# lost-request checks. SmolLM2-135M when the models cache has it, else stories260K.
# Usage: scripts/soak.sh [--hours H] [more soak.py options, e.g. --threads 8 --model stories]
# The summary goes to build/soak-DATE.json; heliosd's log stays in the work folder it names.
set -euo pipefail
cd "$(dirname "$0")/.."
hours=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hours) hours=${2:?--hours needs a number}; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
seconds=$(awk -v h="$hours" 'BEGIN { if (h <= 0) exit 1; printf "%d", h * 3600 }') ||
  { echo "soak: --hours must be a positive number, got '$hours'" >&2; exit 2; }
for bin in build/heliosd build/helios; do
  [ -x "$bin" ] || { echo "soak: $bin is not built (scripts/setup.sh, or cmake --build build)" >&2; exit 1; }
done
model=stories
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] && model=smollm2
out="build/soak-$(date +%Y%m%d-%H%M%S).json"
echo "soak: ${hours} h on $model; summary in $out"
exec /usr/bin/python3 tests/soak/soak.py --seconds "$seconds" --model "$model" --json "$out" --keep ${args[@]+"${args[@]}"}
