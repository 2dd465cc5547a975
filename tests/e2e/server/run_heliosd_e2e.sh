#!/usr/bin/env bash
# ctest entry point of the heliosd end-to-end suite (test_heliosd.py, test_model_group.py,
# test_session.py, test_openai.py, test_faults.py).
# Usage: run_heliosd_e2e.sh BINARY_DIR SOURCE_DIR [unittest args, e.g. test_heliosd.DrainTest]
# The client is Debian's python3-grpcio (/usr/bin/python3, not a pyenv python), with stubs that
# python3-grpc-tools generates at test time. test_openai needs the official openai client too: it
# runs (with the rest) under the test venv's python, which scripts/setup_venv.sh makes from
# /usr/bin/python3 with Debian's site packages; when the venv cannot be made, test_openai fails
# saying how to make it.
set -uo pipefail
BIN=$(cd "$1" && pwd) || exit 1
SRC=$(cd "$2" && pwd) || exit 1
shift 2
PY=/usr/bin/python3
if ! "$PY" -c 'import grpc, grpc_tools.protoc' 2> /dev/null; then
  echo "heliosd e2e: $PY lacks grpc / grpc_tools; run scripts/install_deps.sh (python3-grpcio, python3-grpc-tools)"
  exit 1
fi
if [ $# -eq 0 ]; then set -- test_heliosd test_model_group test_session test_faults test_openai; fi
if printf '%s\n' "$@" | grep -q '^test_openai'; then
  if venv_py=$("$SRC/scripts/setup_venv.sh" | tail -n 1) && [ -x "$venv_py" ]; then
    PY=$venv_py
  else
    echo "heliosd e2e: scripts/setup_venv.sh could not make the test venv (above); test_openai will fail"
  fi
fi
export HELIOS_BINARY_DIR="$BIN" HELIOS_SOURCE_DIR="$SRC"
cd "$(dirname "$0")" || exit 1
exec "$PY" -m unittest -v "$@"
