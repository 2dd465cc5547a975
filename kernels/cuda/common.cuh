// Helpers shared by the kernels: chained launches, warp and block reductions, launch status.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/kernels.h"

namespace helios::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
// The launch's own error, if any (a bad configuration); faults inside a kernel surface later,
// at the next synchronising call.
inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

// --- Chained launches (programmatic dependent launch; devices of compute capability 9.0 on).
// A decode step is a few hundred short kernels in a row: launched one after another, each waits for
// the last to drain, then for its own blocks to be scheduled. A kernel launched with
// launch_chained may be scheduled while the one before it still runs; its threads wait in
// inputs_ready() until that kernel has finished and its writes are visible, then let the next
// chained kernel be scheduled. So every thread of a kernel launched so calls inputs_ready() before
// it touches global memory: the host emulation faults a launch whose thread returns, or reaches a
// barrier or shuffle, without it. Elsewhere inputs_ready() costs nothing.
__device__ __forceinline__ void inputs_ready() {
#if defined(HELIOS_CUDA_HOST_EMULATION)
  ::helios::cuda_host::inputs_ready();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// On unless set_chained_launches(false) (kernels.h: for measuring them), on a device that has them.
inline std::atomic<bool> chained_launches_wanted{true};
inline bool chains_launches_now() {
  if (!chained_launches_wanted.load(std::memory_order_relaxed)) return false;
  thread_local int device = -1;
  thread_local bool chains = false;
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) return false;
  if (d != device) {
    int major = 0;
    chains = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 9;
    device = d;
  }
  return chains;
}

// kernel<<<grid, block, smem, stream>>>(args), chained where the device chains launches; 0 or the
// launch's error. `name` names the kernel in the host emulation's fault reports.
template <typename... Params, typename... Args>
int launch_chained([[maybe_unused]] const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args... args) {
#if defined(HELIOS_CUDA_HOST_EMULATION)
  ::helios::cuda_host::launch(name, grid, block, smem, stream).chained().run([=] {
    kernel(static_cast<Params>(args)...);
  });
  return static_cast<int>(cudaGetLastError());
#else
  cudaLaunchAttribute chain{};
  chain.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chain.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &chain;
  config.numAttrs = chains_launches_now() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  const cudaError_t last = cudaGetLastError();  // the same error, taken so that it is not reported twice
  return static_cast<int>(e != cudaSuccess ? e : last);
#endif
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < n_warps ? scratch[lane] : T(0);
  return warp_sum(total);
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const float m = lane < n_warps ? scratch[lane] : -INFINITY;
  return warp_max(m);
}

// The same bytes as another type, on the device or the host (host-callable code is tested
// without a GPU); memcpy compiles to a register move.
template <typename To, typename From>
__host__ __device__ __forceinline__ To bit_cast(From x) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs types of one size");
  To out;
  std::memcpy(&out, &x, sizeof out);
  return out;
}

// kernels::softmax_logit on the device: NaN as -inf, +inf as FLT_MAX.
__host__ __device__ __forceinline__ float softmax_logit(float x) { return fminf(fmaxf(x, -INFINITY), FLT_MAX); }

// A float's bits as an unsigned key with the same order (larger float → larger key).
__host__ __device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = bit_cast<uint32_t>(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// f32 to f16, rounding to nearest even, as the CPU twin's fp32_to_fp16 (and F16C) do; a NaN keeps
// its sign as the twin's sign | 0x7E00 (the intrinsic alone gives 0x7FFF).
__device__ __forceinline__ __half to_half(float x) {
  if (x != x) {
    return __ushort_as_half(static_cast<unsigned short>(((bit_cast<uint32_t>(x) >> 16) & 0x8000u) | 0x7E00u));
  }
  return __float2half_rn(x);
}

// KV cache elements: f32, or f16 converted on load and rounded to nearest even on store.
__device__ __forceinline__ float load_kv(const float* p) { return *p; }
__device__ __forceinline__ float load_kv(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void store_kv(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_kv(__half* p, float x) { *p = to_half(x); }
// FP8 E4M3: round to nearest even, saturating at ±448, a NaN as sign | 0x7F (the CPU twin's
// fp32_to_fp8_e4m3; the intrinsic drops a NaN's sign).
__device__ __forceinline__ float load_kv(const __nv_fp8_e4m3* p) { return static_cast<float>(*p); }
__device__ __forceinline__ void store_kv(__nv_fp8_e4m3* p, float x) {
  p->__x = x != x ? static_cast<__nv_fp8_storage_t>(((bit_cast<uint32_t>(x) >> 24) & 0x80u) | 0x7Fu)
                  : __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// f(k, v): the cache's K and V as pointers to its element type (float, __half, __nv_fp8_e4m3);
// cudaErrorInvalidValue for another type.
template <typename F>
int with_kv_elements(const PagedKV& cache, F&& f) {
  switch (cache.type) {
    case KvType::kF32:
      return f(static_cast<float*>(cache.k), static_cast<float*>(cache.v));
    case KvType::kF16:
      return f(static_cast<__half*>(cache.k), static_cast<__half*>(cache.v));
    case KvType::kFp8E4M3:
      return f(static_cast<__nv_fp8_e4m3*>(cache.k), static_cast<__nv_fp8_e4m3*>(cache.v));
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// f(std::integral_constant<int, R>{}) with R = n_rows, 1 to 8 (more: 8): one instantiation of a
// kernel templated on its activation rows for each count, so any count up to 8 is one launch.
template <typename F>
void with_row_count(int n_rows, F&& f) {
  switch (n_rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

}  // namespace helios::kernels::cuda
