#!/usr/bin/env bash
# Packs the GPU tests and benchmarks, built here, into one file for a GPU machine that has the CUDA
# toolkit and driver but none of the CPU build's libraries, and no package registry to fetch them:
#
#   bench/gpu/pack_device.sh [BUNDLE]          BUNDLE defaults to .device/bundle.tar.xz
#
# It builds build-bundle/ for one CUDA architecture (HELIOS_BUNDLE_ARCH, default 90: H100 and
# H200) and a CPU any x86-64 server has (HELIOS_BUNDLE_CPU_ARCH, default x86-64-v3: AVX2 and FMA,
# so the CPU side of `compare` runs the AVX2 kernels there), without gRPC (neither the tests nor
# the benchmarks need the server), then packs
#   bin/      helios, helios-bench-gpu, helios_gpu_tests (stripped)
#   lib/      the shared libraries they load that the GPU machine's CUDA toolkit does not give:
#             OpenBLAS, ICU, the GCC runtime. ICU's 30 MB data library is replaced by a 64-byte
#             stand-in (icudata_standin.c says why that is safe)
#   glibc/    this machine's dynamic loader and C library, used when the other image's glibc is
#             older than the one the binaries were linked against
#   MANIFEST  the commit, the architecture and where each library came from
#   SOURCES   the sha256 of each source file the programs were built from
# The CUDA libraries themselves (cudart, cuBLAS, NCCL) are left out: the GPU machine's toolkit has
# them, and they are far larger than what may travel. bench/gpu/run_device.sh finds the bundle in
# .device/ (git ignores it; name it in the device call's carry), checks that it runs there, and
# uses it instead of building.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=${1:-.device/bundle.tar.xz}
ARCH=${HELIOS_BUNDLE_ARCH:-90}
CPU_ARCH=${HELIOS_BUNDLE_CPU_ARCH:-x86-64-v3}
BUILD=build-bundle
TOOLS=(helios bench/helios-bench-gpu tests/helios_gpu_tests)
say() { echo "[pack_device] $*" >&2; }

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] || { say "nvcc not found (PATH, /usr/local/cuda/bin): install the CUDA toolkit"; exit 1; }

say "configuring $BUILD (sm_$ARCH, -march=$CPU_ARCH, no gRPC)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DHELIOS_CUDA=ON -DHELIOS_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC" -DHELIOS_CPU_ARCH="$CPU_ARCH" \
  -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON > "$BUILD.configure.log" 2>&1 \
  || { say "configure failed: see $BUILD.configure.log"; exit 1; }
say "building (the CUDA kernels take about 10 minutes on 2 cores; output in $BUILD.log)"
cmake --build "$BUILD" -j"$(nproc)" --target helios helios-bench-gpu helios_gpu_tests > "$BUILD.log" 2>&1 \
  || { say "build failed: the end of $BUILD.log"; tail -n 30 "$BUILD.log" >&2; exit 1; }

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/glibc"
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.device' || echo ' (with uncommitted changes)')"
  echo "packed $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n)"
  echo "arch $ARCH"
  echo "cpu_arch $CPU_ARCH"
  echo "nvcc $("$NVCC" --version | tail -n 1)"
  echo "glibc $(ldd --version | head -n 1 | awk '{print $NF}')"
} > "$STAGE/MANIFEST"

for tool in "${TOOLS[@]}"; do strip -o "$STAGE/bin/$(basename "$tool")" "$BUILD/$tool"; done

# The sources the programs were built from, as `sha256sum -c` checks them: run_device.sh says so
# loudly when the tree it runs in differs (a bundle packed before the last change to the code).
git ls-files -z -- CMakeLists.txt cmake kernels src include proto bench tests/gpu tests/CMakeLists.txt |
  xargs -0 sha256sum > "$STAGE/SOURCES"

# Every library the tools load, by soname, sorted into what travels and what the GPU machine has.
ldd "${TOOLS[@]/#/$BUILD/}" | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r soname path; do
  case "$soname" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*)
      echo "lib $soname: from the GPU machine's CUDA toolkit" >> "$STAGE/MANIFEST" ;;
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*)
      cp -L "$path" "$STAGE/glibc/$soname"; echo "glibc $soname: $path" >> "$STAGE/MANIFEST" ;;
    libicudata.so.*)
      echo "lib $soname: stand-in (bench/gpu/icudata_standin.c) for $path" >> "$STAGE/MANIFEST" ;;
    *)
      cp -L "$path" "$STAGE/lib/$soname"; echo "lib $soname: $path" >> "$STAGE/MANIFEST" ;;
  esac
done
cp -L /lib64/ld-linux-x86-64.so.2 "$STAGE/glibc/"

# ICU's data stand-in, under the soname and entry point this machine's libicuuc names.
ICUUC=$(ls "$STAGE"/lib/libicuuc.so.* 2>/dev/null | head -n 1 || true)
if [ -n "$ICUUC" ]; then
  ICU_SYMBOL=$(objdump -T "$ICUUC" | awk '$NF ~ /^icudt[0-9]+_dat$/ {s = $NF} END {print s}')
  ICU_SONAME=libicudata.so.${ICUUC##*.so.}
  gcc -shared -fPIC -O2 -DICU_DATA_SYMBOL="$ICU_SYMBOL" -Wl,-soname,"$ICU_SONAME" \
    -o "$STAGE/lib/$ICU_SONAME" bench/gpu/icudata_standin.c
fi

mkdir -p "$(dirname "$BUNDLE")"
say "compressing ($(du -sh "$STAGE" | cut -f1) unpacked)"
tar -C "$STAGE" -cf - . | xz -9e -T"$(nproc)" > "$BUNDLE.tmp"
mv "$BUNDLE.tmp" "$BUNDLE"

# What travels to the GPU machine is the working tree plus carried paths, 64 MiB in all.
tree_bytes=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
bundle_bytes=$(stat -c %s "$BUNDLE")
say "$BUNDLE: $((bundle_bytes / 1048576)) MiB; with the tracked tree $(((tree_bytes + bundle_bytes) / 1048576)) MiB of the 64 MiB that may travel"
[ $((tree_bytes + bundle_bytes)) -le $((64 * 1048576)) ] || say "too large to travel: the device call will refuse it"
cat "$STAGE/MANIFEST" >&2
