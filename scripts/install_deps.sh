#!/usr/bin/env bash
# Installs every system package Helios needs to build and test, from Debian's archive.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git unzip ca-certificates openssl
  libopenblas-dev libicu-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libspdlog-dev libyaml-cpp-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libcpp-httplib-dev
  clang libclang-rt-14-dev llvm   # scripts/fuzz.sh: clang, libFuzzer, llvm-symbolizer
  python3 python3-pip python3-venv python3-grpcio python3-grpc-tools python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "install_deps: 'apt-get update' failed: check that the Debian package mirror is reachable" >&2
  exit 1
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  echo "install_deps: 'apt-get install' failed for: ${missing[*]}" >&2
  exit 1
fi
echo "install_deps: done"
