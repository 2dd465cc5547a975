// Quantized weights (quant_units.cuh) against f32 activations: for a few rows (decode) a block
// stages the activations in shared memory and one warp per output row applies each unit of
// its weights, decoded to floats in registers, to all of them, 1 to 8 rows in one launch, so the
// bytes read per token are the file's; for more rows the weights are dequantized to f16 a slice
// at a time for cuBLAS (launch_dequantize_f16). The backend's decode path takes its activations in
// 8 bits instead (matmul_q8.cu); this one stays as the f32 reference on the device, and the
// benchmark times the two side by side. decode_quant_unit runs the float decoders on the CPU, so a
// test checks their bits against the host's dequantize_row on machines without a GPU.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_units.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

using cuda::block_shape;
using cuda::dispatch;
using cuda::kUnit;
using cuda::kVectorizable;
using cuda::Quant;
using cuda::row_bytes_of;
using cuda::with_loads;

constexpr int kThreads = 256;  // 8 warps, 8 output rows per block

// Activations staged per block: a stretch of every row, each 32-value unit followed by one pad
// float, so the 32 lanes reading 32 different units hit 32 different banks.
constexpr int kStageFloats = 8192;  // about 32 KiB
constexpr int kMaxRows = 8;         // activation rows one launch serves
__device__ __forceinline__ int32_t padded(int32_t c) { return c + c / kUnit; }

// Columns staged per pass for R rows: a multiple of 1024 (one unit per lane).
template <int R>
constexpr int32_t kStageCols = kStageFloats * kUnit / (kUnit + 1) / R / 1024 * 1024 > 1024
                                   ? kStageFloats * kUnit / (kUnit + 1) / R / 1024 * 1024 : 1024;

// From 2 rows on a thread holds a unit's 32 values, its words and R sums: at least 4 blocks of
// kThreads per SM leave it 64 registers, where ptxas' own choice (48) spilled 8-28 bytes per
// thread in some (ptxas -v, sm_90). One row keeps ptxas' choice (under 48 registers, more blocks
// per SM).
template <int R>
constexpr int kMinBlocksPerSm = R >= 2 ? 4 : 0;  // 0: unspecified

template <uint32_t kType, int R, bool kVector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<R>) gemv_quant_kernel(const float* __restrict__ x,
                                                              const uint8_t* __restrict__ w, int64_t row_bytes,
                                                              int32_t n_in, int32_t n_out, float* __restrict__ y) {
  constexpr int32_t kCols = kStageCols<R>;
  constexpr int32_t kRowStride = kCols + kCols / kUnit;
  __shared__ float xs[R * kRowStride];
  const int lane = threadIdx.x % 32;
  const int32_t o = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const bool active = o < n_out;  // every thread stages, even without a row of its own
  const uint8_t* wr = w + static_cast<int64_t>(active ? o : 0) * row_bytes;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  for (int32_t c0 = 0; c0 < n_in; c0 += kCols) {
    const int32_t n = min(kCols, n_in - c0);  // a multiple of kUnit
    __syncthreads();  // the previous stretch is no longer read
    for (int32_t i = threadIdx.x; i < R * n; i += kThreads) {
      const int32_t r = i / n, c = i % n;
      xs[r * kRowStride + padded(c)] = x[static_cast<int64_t>(r) * n_in + c0 + c];
    }
    __syncthreads();
    if (!active) continue;
    for (int32_t u = lane; u < n / kUnit; u += 32) {
      float v[kUnit];
      Quant<kType>::template unit<kVector>(wr, c0 / kUnit + u, v);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* xr = xs + r * kRowStride + u * (kUnit + 1);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kUnit; ++j) s += v[j] * xr[j];
        acc[r] += s;
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = cuda::warp_sum(acc[r]);
    if (lane == 0) y[static_cast<int64_t>(r) * n_out + o] = s;
  }
}

template <uint32_t kType, bool kVector>
__global__ void dequantize_f16_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int32_t n_in,
                                      int64_t n_units, __half* __restrict__ out) {
  const int32_t units_per_row = n_in / kUnit;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_units;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / units_per_row;
    const auto u = static_cast<int32_t>(i % units_per_row);
    float v[kUnit];
    Quant<kType>::template unit<kVector>(w + row * row_bytes, u, v);
    __half* o = out + row * n_in + static_cast<int64_t>(u) * kUnit;
#pragma unroll
    for (int j = 0; j < kUnit; ++j) o[j] = __float2half_rn(v[j]);
  }
}

template <uint32_t kType, int R>
void launch_rows(const float* x, const uint8_t* w, int64_t row_bytes, int32_t n_in, int32_t n_out, float* y,
                 cudaStream_t stream) {
  const unsigned blocks = (n_out + kThreads / 32 - 1) / (kThreads / 32);
  with_loads<kType>(w, row_bytes, [&](auto vector) {
    gemv_quant_kernel<kType, R, decltype(vector)::value><<<blocks, kThreads, 0, stream>>>(x, w, row_bytes, n_in,
                                                                                         n_out, y);
  });
}

// One launch per kMaxRows rows (the last may have fewer): each weight byte read once per launch.
template <uint32_t kType>
int gemv(const float* x, const uint8_t* w, int64_t row_bytes, int32_t n_rows, int32_t n_in, int32_t n_out,
         float* y, cudaStream_t s) {
  for (int32_t r = 0; r < n_rows; r += kMaxRows) {
    const float* xr = x + static_cast<int64_t>(r) * n_in;
    float* yr = y + static_cast<int64_t>(r) * n_out;
    cuda::with_row_count(std::min(kMaxRows, n_rows - r), [&](auto rows) {
      launch_rows<kType, decltype(rows)::value>(xr, w, row_bytes, n_in, n_out, yr, s);
    });
  }
  return cuda::launch_status();
}

template <uint32_t kType>
int dequantize(const uint8_t* w, int64_t row_bytes, int32_t n_rows, int32_t n_in, __half* out, cudaStream_t s) {
  const int64_t n_units = static_cast<int64_t>(n_rows) * (n_in / kUnit);
  const int64_t blocks = std::min<int64_t>((n_units + 255) / 256, 65535 * 16);
  with_loads<kType>(w, row_bytes, [&](auto vector) {
    dequantize_f16_kernel<kType, decltype(vector)::value>
        <<<static_cast<unsigned>(blocks), 256, 0, s>>>(w, row_bytes, n_in, n_units, out);
  });
  return cuda::launch_status();
}

template <uint32_t kType>
struct Gemv {
  static int run(const float* x, const uint8_t* w, int64_t row_bytes, int32_t n_rows, int32_t n_in, int32_t n_out,
                 float* y, cudaStream_t s) {
    return gemv<kType>(x, w, row_bytes, n_rows, n_in, n_out, y, s);
  }
};
template <uint32_t kType>
struct DecodeUnit {  // on the host: both load paths, so the test sees each
  static int run(const uint8_t* row, int32_t u, bool vector, float* v) {
    if (vector && kVectorizable<kType>) {
      Quant<kType>::template unit<true>(row, u, v);
    } else {
      Quant<kType>::template unit<false>(row, u, v);
    }
    return 0;
  }
};
template <uint32_t kType>
struct Dequantize {
  static int run(const uint8_t* w, int64_t row_bytes, int32_t n_rows, int32_t n_in, __half* out, cudaStream_t s) {
    return dequantize<kType>(w, row_bytes, n_rows, n_in, out, s);
  }
};

}  // namespace

int launch_matmul_quant(uint32_t weight_type, const float* x, const void* w, int32_t n_rows, int32_t n_in,
                        int32_t n_out, float* y, void* stream) {
  if (n_rows <= 0 || n_out <= 0) return 0;
  const int64_t row_bytes = row_bytes_of(weight_type, n_in);
  if (row_bytes == 0) return static_cast<int>(cudaErrorInvalidValue);
  const auto* wb = static_cast<const uint8_t*>(w);
  return dispatch<Gemv>(weight_type, x, wb, row_bytes, n_rows, n_in, n_out, y, cuda::as_stream(stream));
}

int decode_quant_unit(uint32_t weight_type, const void* row, int32_t unit, bool vector_loads, float* out) {
  if (block_shape(weight_type).values == 0) return static_cast<int>(cudaErrorInvalidValue);
  return dispatch<DecodeUnit>(weight_type, static_cast<const uint8_t*>(row), unit, vector_loads, out);
}

int launch_dequantize_f16(uint32_t weight_type, const void* w, int32_t n_rows, int32_t n_in, uint16_t* out,
                          void* stream) {
  if (n_rows <= 0) return 0;
  const int64_t row_bytes = row_bytes_of(weight_type, n_in);
  if (row_bytes == 0) return static_cast<int>(cudaErrorInvalidValue);
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* oh = reinterpret_cast<__half*>(out);
  return dispatch<Dequantize>(weight_type, wb, row_bytes, n_rows, n_in, oh, cuda::as_stream(stream));
}

}  // namespace helios::kernels
