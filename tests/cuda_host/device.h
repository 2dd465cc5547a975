// The CUDA kernels' source run on the host: what a kernel file needs from nvcc, for a host compiler.
// translate.py rewrites each kernels/cuda/*.cu into C++ that includes this first: a launch
// `k<<<grid, block, smem, stream>>>(args)` becomes cuda_host::launch(...)(args), and a __shared__
// declaration a reference into the running block's shared memory. Types and conversions (__half,
// __nv_bfloat16, __nv_fp8_e4m3, dim3) are the CUDA toolkit's own host-callable headers; the rest —
// threads, barriers, warp shuffles, read-only loads, the _rn arithmetic, atomics — is here and in
// scheduler.cpp, which runs each block's threads as fibers. What it checks and what it cannot:
// tests/cuda_host/README.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace helios::cuda_host {

// The thread a fiber stands for, and its block's shape.
struct ThreadPlace {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadPlace& place();  // the running fiber's

// Barriers and shuffles: the running fiber waits for the others (scheduler.cpp).
void sync_block();
void sync_warp(unsigned mask);
uint64_t exchange(unsigned mask, uint64_t bits, int src_lane);  // src_lane: the lane whose bits come back

// The running block's shared memory: a declaration site's storage (poisoned with 0xFF bytes when
// the block starts, as nothing initialises shared memory), and the launch's dynamic bytes.
void* block_shared(int site, size_t bytes, size_t align);
void* dynamic_shared();

// Out of line, so that the host compiler cannot fuse them into a multiply-add.
float mul_rn(float a, float b);
float add_rn(float a, float b);
float sub_rn(float a, float b);
float div_rn(float a, float b);

template <typename T, size_t kAlign>
struct alignas(kAlign) Aligned {
  T value;
};

template <typename T>
T& shared_at(int site) {
  return *static_cast<T*>(block_shared(site, sizeof(T), alignof(T)));
}

template <typename T>
T shuffle(unsigned mask, T v, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a shuffle moves up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = exchange(mask, bits, src_lane);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

inline int lane_id() {
  const ThreadPlace& p = place();
  const unsigned linear = p.thread_idx.x + p.block_dim.x * (p.thread_idx.y + p.block_dim.y * p.thread_idx.z);
  return static_cast<int>(linear % 32);
}

// The running thread of a chained launch may touch global memory from now on (common.cuh's
// inputs_ready; scheduler.cpp checks that each such thread gets here first).
void inputs_ready();

// Runs `body` for every thread of the grid, in stream order (runtime.cpp: now, or when a captured
// graph is launched). Sets the launch's own error, as cudaGetLastError reports it.
void launch_grid(const char* name, dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, bool chained,
                 std::function<void()> body);

// A launch's configuration; run() takes the kernel called with its arguments, copied.
struct Launch {
  const char* name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  bool is_chained = false;

  Launch chained() const {
    Launch l = *this;
    l.is_chained = true;
    return l;
  }
  template <typename Body>
  void run(Body body) const {
    launch_grid(name, grid, block, smem, stream, is_chained, std::function<void()>(std::move(body)));
  }
};

inline Launch launch(const char* name, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
  return Launch{name, grid, block, smem, stream, false};
}

}  // namespace helios::cuda_host

#define threadIdx (::helios::cuda_host::place().thread_idx)
#define blockIdx (::helios::cuda_host::place().block_idx)
#define blockDim (::helios::cuda_host::place().block_dim)
#define gridDim (::helios::cuda_host::place().grid_dim)
#define warpSize 32

inline void __syncthreads() { ::helios::cuda_host::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::helios::cuda_host::sync_warp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::helios::cuda_host::lane_id();
  return ::helios::cuda_host::shuffle(mask, v, lane / width * width + src % width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::helios::cuda_host::lane_id();
  const int src = lane ^ lane_mask;
  return ::helios::cuda_host::shuffle(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::helios::cuda_host::lane_id();
  const int src = lane + static_cast<int>(delta);
  return ::helios::cuda_host::shuffle(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::helios::cuda_host::lane_id();
  const int src = lane - static_cast<int>(delta);
  return ::helios::cuda_host::shuffle(mask, v, src >= 0 && src / width == lane / width ? src : lane);
}

template <typename T>
T __ldg(const T* p) {
  return *p;
}

inline float __fmul_rn(float a, float b) { return ::helios::cuda_host::mul_rn(a, b); }
inline float __fadd_rn(float a, float b) { return ::helios::cuda_host::add_rn(a, b); }
inline float __fsub_rn(float a, float b) { return ::helios::cuda_host::sub_rn(a, b); }
inline float __fdiv_rn(float a, float b) { return ::helios::cuda_host::div_rn(a, b); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Blocks run one at a time per host thread and grids on several: global memory takes real atomics.
template <typename T, typename F>
T atomic_update(T* p, F f) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, f(old), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline int atomicMin(int* p, int v) { return atomic_update(p, [v](int x) { return std::min(x, v); }); }
inline int atomicMax(int* p, int v) { return atomic_update(p, [v](int x) { return std::max(x, v); }); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

using std::max;
using std::min;
