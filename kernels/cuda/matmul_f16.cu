// Half-precision weights times f32 activations for a few rows (decode): one warp per output row
// streams the weight row in 16-byte loads and applies it to up to 8 activation rows at once, so
// each weight byte is read once per 8 rows. Batch-1 decode is bound by these weight reads.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;  // 8 warps, 8 output rows per block

template <int R, bool kVector>
__global__ void __launch_bounds__(kThreads) gemv_f16_kernel(const float* x, const __half* w,
                                                            int32_t n_in, int32_t n_out, float* y) {
  const int lane = threadIdx.x % 32;
  const int32_t o = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  if (o >= n_out) return;
  const __half* wr = w + static_cast<int64_t>(o) * n_in;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if constexpr (kVector) {
#pragma unroll 4
    for (int32_t i = lane * 8; i < n_in; i += 32 * 8) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr + i));
      const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
      float2 wf[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) wf[k] = __half22float2(h2[k]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * n_in + i);
        const float4 a = xr[0], b = xr[1];
        acc[r] += wf[0].x * a.x + wf[0].y * a.y + wf[1].x * a.z + wf[1].y * a.w +
                  wf[2].x * b.x + wf[2].y * b.y + wf[3].x * b.z + wf[3].y * b.w;
      }
    }
  } else {
    for (int32_t i = lane; i < n_in; i += 32) {
      const float wv = __half2float(wr[i]);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += wv * x[static_cast<int64_t>(r) * n_in + i];
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = cuda::warp_sum(acc[r]);
    if (lane == 0) y[static_cast<int64_t>(r) * n_out + o] = s;
  }
}

template <int R>
void launch_rows(const float* x, const __half* w, int32_t n_in, int32_t n_out, float* y, bool vec,
                 cudaStream_t stream) {
  const unsigned blocks = (n_out + kThreads / 32 - 1) / (kThreads / 32);
  if (vec) {
    gemv_f16_kernel<R, true><<<blocks, kThreads, 0, stream>>>(x, w, n_in, n_out, y);
  } else {
    gemv_f16_kernel<R, false><<<blocks, kThreads, 0, stream>>>(x, w, n_in, n_out, y);
  }
}

__global__ void f32_to_f16_kernel(const float* x, int64_t n, __half* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2half_rn(x[i]);
  }
}

}  // namespace

int launch_matmul_f16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                      int32_t n_out, float* y, void* stream) {
  if (n_rows <= 0 || n_out <= 0) return 0;
  const auto* wh = reinterpret_cast<const __half*>(w);
  // 16-byte loads need 8-value rows on 16-byte boundaries (cudaMalloc gives 256).
  const bool vec = n_in % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const cudaStream_t s = cuda::as_stream(stream);
  int32_t r = 0;
  for (; r + 8 <= n_rows; r += 8) launch_rows<8>(x + static_cast<int64_t>(r) * n_in, wh, n_in, n_out, y + static_cast<int64_t>(r) * n_out, vec, s);
  if (r + 4 <= n_rows) { launch_rows<4>(x + static_cast<int64_t>(r) * n_in, wh, n_in, n_out, y + static_cast<int64_t>(r) * n_out, vec, s); r += 4; }
  if (r + 2 <= n_rows) { launch_rows<2>(x + static_cast<int64_t>(r) * n_in, wh, n_in, n_out, y + static_cast<int64_t>(r) * n_out, vec, s); r += 2; }
  if (r < n_rows) launch_rows<1>(x + static_cast<int64_t>(r) * n_in, wh, n_in, n_out, y + static_cast<int64_t>(r) * n_out, vec, s);
  return cuda::launch_status();
}

int launch_f32_to_f16(const float* x, int64_t n, uint16_t* out, void* stream) {
  if (n <= 0) return 0;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535 * 16);
  f32_to_f16_kernel<<<static_cast<unsigned>(blocks), 256, 0, cuda::as_stream(stream)>>>(
      x, n, reinterpret_cast<__half*>(out));
  return cuda::launch_status();
}

}  // namespace helios::kernels
