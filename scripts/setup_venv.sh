#!/usr/bin/env bash
# Makes the test virtual environment .venv-test (git-ignored) for the tests that need packages
# Debian does not ship: the official `openai` Python client, pinned (tests/e2e/server/test_openai.py
# drives heliosd's OpenAI-compatible HTTP API with it). It is made from Debian's /usr/bin/python3 with
# --system-site-packages, so python3-grpcio and the rest of Debian's packages stay visible.
# Idempotent: a venv that already has the pinned versions is left alone. Prints the venv's python.
#
#   scripts/setup_venv.sh            make or check .venv-test; its python on the last line
#   scripts/setup_venv.sh --python   only print that path (exit 1 when the venv is not ready)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-test
PY=/usr/bin/python3
# Pinned, with what it needs beyond the standard library (pip resolves the rest, from PyPI). httpx
# too: openai 1.54 passes `proxies`, which httpx 0.28 removed.
REQUIREMENTS=("openai==1.54.0" "httpx==0.27.2")
STAMP="$VENV/.helios-requirements"
want="${REQUIREMENTS[*]}"

ready() { [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
          "$VENV/bin/python" -c 'import openai, grpc' 2> /dev/null; }

if [ "${1:-}" = "--python" ]; then
  ready && { echo "$PWD/$VENV/bin/python"; exit 0; }
  exit 1
fi
if ready; then
  echo "setup_venv: $VENV is ready ($want)"
  echo "$PWD/$VENV/bin/python"
  exit 0
fi
if ! "$PY" -c 'import venv, ensurepip' 2> /dev/null; then
  echo "setup_venv: $PY cannot make a virtual environment: install python3-venv (scripts/install_deps.sh)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_venv: making $VENV (from $PY, with Debian's site packages)"
  "$PY" -m venv --system-site-packages "$VENV"
fi
echo "setup_venv: installing $want into $VENV (from PyPI)"
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"; then
  echo "setup_venv: 'pip install ${REQUIREMENTS[*]}' failed: check that PyPI is reachable (network, proxy)," \
       "then run scripts/setup_venv.sh again" >&2
  exit 1
fi
echo "$want" > "$STAMP"
echo "setup_venv: done"
echo "$PWD/$VENV/bin/python"
