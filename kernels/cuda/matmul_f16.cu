// 16-bit weights (IEEE half or bfloat16) times f32 activations for a few rows (decode). A block
// stages a stretch of every activation row in shared memory, then each of its warps streams one
// weight row in 16-byte loads and applies it to all of them: one launch serves 1 to 8 rows, so
// each weight byte is read once per 8 rows whatever their count. Batch-1 decode is bound by these
// weight reads. Matrices of one input (Q, K and V; gate and up) can share a launch, their output
// rows laid one after another over the grid (gemv_products.cuh), each with its bias.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_products.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;         // 8 warps, 8 output rows per block
static_assert(kThreads / 32 == cuda::kGemvWarps, "a warp per output row, as gemv_products.cuh lays them out");
constexpr int kMaxRows = 8;           // activation rows one launch serves
constexpr int kStageFloats = 8192;    // 32 KiB of activations staged at a time

// Columns staged per pass for R rows: a multiple of 256 (a warp's 8-wide stride).
template <int R>
constexpr int32_t kStageCols = kStageFloats / R / 256 * 256 > 256 ? kStageFloats / R / 256 * 256 : 256;

__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float to_float(__half h) { return __half2float(h); }
__device__ __forceinline__ float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }

template <typename W>
struct Pair;
template <>
struct Pair<__half> { using type = __half2; };
template <>
struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

template <typename W, int R, bool kVector>
__global__ void __launch_bounds__(kThreads) gemv_16bit_kernel(const float* x, cuda::GemvTargets t, int32_t n_in) {
  cuda::inputs_ready();
  constexpr int32_t kCols = kStageCols<R>;
  __shared__ __align__(16) float xs[R * kCols];
  const int lane = threadIdx.x % 32;
  const cuda::WarpRow m = cuda::warp_row(t, static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(threadIdx.x / 32));
  const int32_t o = m.o, n_out = m.n_out;
  const bool active = o < n_out;  // every thread stages, even without a row of its own
  const W* wr = static_cast<const W*>(m.w) + static_cast<int64_t>(active ? o : 0) * n_in;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  for (int32_t c0 = 0; c0 < n_in; c0 += kCols) {
    const int32_t n = min(kCols, n_in - c0);
    __syncthreads();  // the previous stretch is no longer read
    for (int32_t i = threadIdx.x; i < R * n; i += kThreads) {
      const int32_t r = i / n, c = i % n;
      xs[r * kCols + c] = x[static_cast<int64_t>(r) * n_in + c0 + c];
    }
    __syncthreads();
    if (!active) continue;
    if constexpr (kVector) {  // n is a multiple of 8 here
#pragma unroll 4
      for (int32_t i = lane * 8; i < n; i += 32 * 8) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr + c0 + i));
        const auto* pairs = reinterpret_cast<const typename Pair<W>::type*>(&raw);
        float2 wf[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) wf[k] = to_float2(pairs[k]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4* xr = reinterpret_cast<const float4*>(xs + r * kCols + i);
          const float4 a = xr[0], b = xr[1];
          acc[r] += wf[0].x * a.x + wf[0].y * a.y + wf[1].x * a.z + wf[1].y * a.w +
                    wf[2].x * b.x + wf[2].y * b.y + wf[3].x * b.z + wf[3].y * b.w;
        }
      }
    } else {
      for (int32_t i = lane; i < n; i += 32) {
        const float wv = to_float(wr[c0 + i]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += wv * xs[r * kCols + i];
      }
    }
  }
  if (!active) return;
  // The output and bias picked again here rather than held in registers through the loop.
  const cuda::WarpRow out = cuda::warp_row(t, static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(threadIdx.x / 32));
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = cuda::warp_sum(acc[r]);
    if (lane == 0) {
      float& y = out.y[static_cast<int64_t>(r) * n_out + o];
      const float v = out.bias ? s + out.bias[o] : s;
      y = out.accumulate ? y + v : v;
    }
  }
}

template <typename W>
int gemv_16bit(const float* x, int32_t n_rows, int32_t n_in, const GemvProducts& products, void* stream) {
  if (n_rows <= 0) return 0;
  cuda::GemvTargets t;
  int32_t blocks = 0;
  if (n_in <= 0 || !cuda::make_targets(products, &t, &blocks)) return static_cast<int>(cudaErrorInvalidValue);
  if (t.n == 0) return 0;
  // 16-byte weight loads need 8-value rows on 16-byte boundaries (cudaMalloc gives 256).
  const bool vec = n_in % 8 == 0 && cuda::or_of_addresses(t) % 16 == 0;
  const cudaStream_t s = cuda::as_stream(stream);
  int err = 0;
  for (int32_t r = 0; r < n_rows && err == 0; r += kMaxRows) {
    const cuda::GemvTargets tr = cuda::from_row(t, r);
    const float* xr = x + static_cast<int64_t>(r) * n_in;
    cuda::with_row_count(std::min(kMaxRows, n_rows - r), [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      err = vec ? cuda::launch_chained("gemv_16bit_kernel", gemv_16bit_kernel<W, R, true>, blocks, kThreads, 0, s, xr,
                                       tr, n_in)
                : cuda::launch_chained("gemv_16bit_kernel", gemv_16bit_kernel<W, R, false>, blocks, kThreads, 0, s, xr,
                                       tr, n_in);
    });
  }
  return err;
}


__global__ void f32_to_f16_kernel(const float* x, int64_t n, __half* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = cuda::to_half(x[i]);
  }
}

// The twin's integer rounding (fp32_to_bf16), bit for bit, NaNs included.
__global__ void f32_to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t b = __float_as_uint(x[i]);
    out[i] = (b & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((b >> 16) | 64)
                                             : static_cast<uint16_t>((b + (0x7FFFu + ((b >> 16) & 1u))) >> 16);
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535 * 16)); }

}  // namespace

int launch_matmul_f16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                      int32_t n_out, float* y, void* stream) {
  return gemv_16bit<__half>(x, n_rows, n_in, GemvProducts::of(w, n_out, y), stream);
}

int launch_matmul_f16_products(const float* x, int32_t n_rows, int32_t n_in, const GemvProducts& products,
                               void* stream) {
  return gemv_16bit<__half>(x, n_rows, n_in, products, stream);
}

int launch_matmul_bf16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                       int32_t n_out, float* y, void* stream) {
  return gemv_16bit<__nv_bfloat16>(x, n_rows, n_in, GemvProducts::of(w, n_out, y), stream);
}

int launch_matmul_bf16_products(const float* x, int32_t n_rows, int32_t n_in, const GemvProducts& products,
                                void* stream) {
  return gemv_16bit<__nv_bfloat16>(x, n_rows, n_in, products, stream);
}

int launch_f32_to_f16(const float* x, int64_t n, uint16_t* out, void* stream) {
  if (n <= 0) return 0;
  f32_to_f16_kernel<<<grid_for(n), 256, 0, cuda::as_stream(stream)>>>(x, n, reinterpret_cast<__half*>(out));
  return cuda::launch_status();
}

int launch_f32_to_bf16(const float* x, int64_t n, uint16_t* out, void* stream) {
  if (n <= 0) return 0;
  f32_to_bf16_kernel<<<grid_for(n), 256, 0, cuda::as_stream(stream)>>>(x, n, out);
  return cuda::launch_status();
}

}  // namespace helios::kernels
