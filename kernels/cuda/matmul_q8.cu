// Quantized weights against activations in 8 bits, the CPU backend's arithmetic on the device (as
// llama.cpp's CUDA matrix-vector kernels do it): one launch rounds each activation row as
// ref_quantize_activations does for the weight type, a thread per 32 values (Q8_K's scale is
// shared by 8 of them, which agree on it through shuffles); then one warp per output row takes a
// unit of its weights per lane, as 8-bit integers in registers (quant_units.cuh), against 1 to 8
// activation rows with dp4a. Per unit and row a lane reads 32 bytes of activations and their two
// scales, against 128 bytes of f32 in shared memory for the f32 kernel (matmul_quant.cu): 4x less
// on the path that bounds a decode step once the weights stream at full bandwidth. The integer
// sums are the CPU twin's exactly; only the order of the float sums differs.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_products.cuh"
#include "kernels/cuda/q8_rounding.cuh"
#include "kernels/cuda/quant_units.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

using cuda::Act;
using cuda::act_of;
using cuda::IntUnit;
using cuda::kUnit;
using cuda::kUnitsPerScale;
using cuda::larger;
using cuda::Peak;
using cuda::Q8Rows;
using cuda::q8_row_stride;
using cuda::q8_rows;
using cuda::quantize_unit;
using cuda::QuantInts;
using cuda::unit_peak;

constexpr int kThreads = 256;  // 8 warps, 8 output rows per block
static_assert(kThreads / 32 == cuda::kGemvWarps, "a warp per output row, as gemv_products.cuh lays them out");
constexpr int kMaxRows = 8;    // activation rows one launch serves

// --- The activations' rounding, per unit of 32 values (q8_rounding.cuh).

// A thread per unit, its row's units in consecutive threads.
template <Act kAct, bool kVectorX>
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_units, Q8Rows rows) {
  cuda::inputs_ready();
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool active = u < n_units;  // every lane shuffles, with or without a unit
  float v[kUnit] = {};
  if (active) {
    const float* xu = x + u * kUnit;
    if constexpr (kVectorX) {
      for (int i = 0; i < kUnit / 4; ++i) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(xu) + i);
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
    } else {
      for (int j = 0; j < kUnit; ++j) v[j] = __ldg(xu + j);
    }
  }
  const int32_t units_per_row = rows.n_in / kUnit;
  cuda::round_unit<kAct>(v, active, u / units_per_row, static_cast<int32_t>(u % units_per_row), rows);
}

// The host's run of the same code: each scale group's peaks combined in order.
template <Act kAct>
void quantize_on_host(const float* x, int32_t n_rows, const Q8Rows& rows) {
  constexpr int kGroup = kUnitsPerScale<kAct>;
  const int32_t units_per_row = rows.n_in / kUnit;
  for (int32_t r = 0; r < n_rows; ++r) {
    for (int32_t g = 0; g < units_per_row; g += kGroup) {
      const float* xg = x + static_cast<int64_t>(r) * rows.n_in + g * kUnit;
      Peak p;
      for (int k = 0; k < kGroup; ++k) p = larger(p, unit_peak(xg + k * kUnit, k * kUnit));
      for (int k = 0; k < kGroup; ++k) {
        uint32_t words[8];
        rows.ds(r)[g + k] = quantize_unit<kAct>(xg + k * kUnit, p, words);
        int8_t* q = rows.q(r) + (g + k) * kUnit;
        for (int j = 0; j < kUnit; ++j) q[j] = static_cast<int8_t>(words[j / 4] >> (8 * (j % 4)));
      }
    }
  }
}

// --- The product.

// From 2 rows a thread holds a unit's 8 words, the activations' words and R sums: left to its
// own choice, ptxas took 40-48 registers and spilled 4-24 bytes for some types at 2-5 rows (ptxas
// -v, sm_90). 3 blocks of kThreads per SM leave it up to 80 registers, which Q4_K at 7 and 8 rows
// still spilled past; 2 leave 128. One row keeps ptxas' choice.
template <int R>
constexpr int kMinBlocksPerSm = R == 1 ? 0 : R <= 6 ? 3 : 2;  // 0: unspecified

template <uint32_t kType, int R, bool kVector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<R>) gemv_q8_kernel(Q8Rows xq, cuda::GemvTargets t,
                                                                               int64_t row_bytes) {
  cuda::inputs_ready();
  const cuda::WarpRow m = cuda::warp_row(t, static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(threadIdx.x / 32));
  if (m.o >= m.n_out) return;
  const int lane = threadIdx.x % 32;
  const int32_t n_units = xq.n_in / kUnit;
  const uint8_t* wr = static_cast<const uint8_t*>(m.w) + static_cast<int64_t>(m.o) * row_bytes;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int32_t u = lane; u < n_units; u += 32) {
    const IntUnit wu = QuantInts<kType>::template unit<kVector>(wr, u);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const auto* xv = reinterpret_cast<const uint4*>(xq.q(r)) + 2 * u;
      const uint4 a = __ldg(xv), b = __ldg(xv + 1);
      const uint32_t x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      const float2 ds = __ldg(xq.ds(r) + u);
      acc[r] += cuda::unit_share<kType>(wu, x, ds.x, ds.y);
    }
  }
  // The output picked again here rather than held in registers through the loop.
  const cuda::WarpRow out = cuda::warp_row(t, static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(threadIdx.x / 32));
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = cuda::warp_sum(acc[r]);
    if (lane == 0) {
      float& y = out.y[static_cast<int64_t>(r) * out.n_out + out.o];
      const float v = out.bias ? s + out.bias[out.o] : s;
      y = out.accumulate ? y + v : v;
    }
  }
}

template <uint32_t kType>
struct Quantize {
  static int run(const float* x, int32_t n_rows, Q8Rows rows, cudaStream_t s) {
    constexpr Act kAct = act_of(kType);
    const int64_t n_units = static_cast<int64_t>(n_rows) * (rows.n_in / kUnit);
    const auto blocks = static_cast<unsigned>((n_units + kThreads - 1) / kThreads);
    if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      return cuda::launch_chained("quantize_q8_kernel", quantize_q8_kernel<kAct, true>, blocks, kThreads, 0, s, x,
                                  n_units, rows);
    }
    return cuda::launch_chained("quantize_q8_kernel", quantize_q8_kernel<kAct, false>, blocks, kThreads, 0, s, x, n_units,
                                rows);
  }
};

// One launch per kMaxRows rows (the last may have fewer): each weight byte read once per launch.
template <uint32_t kType>
struct GemvQ8 {
  static int run(Q8Rows xq, cuda::GemvTargets t, int64_t row_bytes, int32_t n_rows, unsigned blocks, cudaStream_t s) {
    const auto* any = reinterpret_cast<const uint8_t*>(cuda::or_of_addresses(t));
    int err = 0;
    for (int32_t r = 0; r < n_rows && err == 0; r += kMaxRows) {
      const Q8Rows rows{xq.base + r * xq.stride, xq.n_in, xq.stride};
      const cuda::GemvTargets tr = cuda::from_row(t, r);
      cuda::with_row_count(std::min(kMaxRows, n_rows - r), [&](auto count) {
        cuda::with_loads<kType>(any, row_bytes, [&](auto vector) {
          err = cuda::launch_chained("gemv_q8_kernel",
                                     gemv_q8_kernel<kType, decltype(count)::value, decltype(vector)::value>, blocks,
                                     kThreads, 0, s, rows, tr, row_bytes);
        });
      });
    }
    return err;
  }
};

template <uint32_t kType>
struct QuantizeOnHost {
  static int run(const float* x, int32_t n_rows, Q8Rows rows) {
    quantize_on_host<act_of(kType)>(x, n_rows, rows);
    return 0;
  }
};

template <uint32_t kType>
struct UnitShare {  // on the host: both load paths, so the test sees each
  static int run(const uint8_t* row, int32_t u, bool vector, const int8_t* xq, float d, float s, float* share) {
    uint32_t x[8] = {};
    for (int j = 0; j < kUnit; ++j) x[j / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(xq[j])) << (8 * (j % 4));
    const IntUnit wu = vector && cuda::kVectorizable<kType> ? QuantInts<kType>::template unit<true>(row, u)
                                                            : QuantInts<kType>::template unit<false>(row, u);
    *share = cuda::unit_share<kType>(wu, x, d, s);
    return 0;
  }
};

}  // namespace

size_t matmul_quant_q8_workspace_bytes(int32_t n_rows, int32_t n_in) {
  if (n_rows <= 0 || n_in <= 0) return 0;
  return static_cast<size_t>(n_rows) * static_cast<size_t>(q8_row_stride(n_in));
}

bool q8_rounds_alike(uint32_t type_a, uint32_t type_b) {
  return cuda::block_shape(type_a).values != 0 && cuda::block_shape(type_b).values != 0 &&
         act_of(type_a) == act_of(type_b);
}


int launch_quantize_q8(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in, void* workspace,
                       size_t workspace_bytes, void* stream) {
  if (n_rows <= 0) return 0;
  if (!cuda::q8_args_ok(weight_type, n_rows, n_in, workspace, workspace_bytes)) return static_cast<int>(cudaErrorInvalidValue);
  return cuda::dispatch<Quantize>(weight_type, x, n_rows, q8_rows(workspace, n_in), cuda::as_stream(stream));
}

int launch_matmul_q8_rows(uint32_t weight_type, const void* workspace, const void* w, int32_t n_rows, int32_t n_in,
                          int32_t n_out, float* y, const float* bias, void* stream) {
  return launch_matmul_q8_products(weight_type, workspace, n_rows, n_in, GemvProducts::of(w, n_out, y, bias), stream);
}

int launch_matmul_q8_products(uint32_t weight_type, const void* workspace, int32_t n_rows, int32_t n_in,
                              const GemvProducts& products, void* stream) {
  if (n_rows <= 0) return 0;
  const int64_t row_bytes = cuda::row_bytes_of(weight_type, n_in);
  if (row_bytes == 0 || !workspace || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cuda::GemvTargets t;
  int32_t blocks = 0;
  if (!cuda::make_targets(products, &t, &blocks)) return static_cast<int>(cudaErrorInvalidValue);
  if (t.n == 0) return 0;
  return cuda::dispatch<GemvQ8>(weight_type, q8_rows(workspace, n_in), t, row_bytes, n_rows,
                                static_cast<unsigned>(blocks), cuda::as_stream(stream));
}

int launch_matmul_quant_q8(uint32_t weight_type, const float* x, const void* w, int32_t n_rows, int32_t n_in,
                           int32_t n_out, float* y, void* workspace, size_t workspace_bytes, void* stream) {
  if (n_rows <= 0 || n_out <= 0) return 0;
  if (const int e = launch_quantize_q8(weight_type, x, n_rows, n_in, workspace, workspace_bytes, stream); e != 0) {
    return e;
  }
  return launch_matmul_q8_rows(weight_type, workspace, w, n_rows, n_in, n_out, y, nullptr, stream);
}

int quantize_activations_q8(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in, void* workspace) {
  if (cuda::row_bytes_of(weight_type, n_in) == 0 || n_rows < 0 || !workspace) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return cuda::dispatch<QuantizeOnHost>(weight_type, x, n_rows, q8_rows(workspace, n_in));
}

int gemv_products_warp_row(const GemvProducts& products, int32_t block, int32_t warp, float** y, int32_t* row,
                           int32_t* n_blocks) {
  cuda::GemvTargets t;
  if (!cuda::make_targets(products, &t, n_blocks) || warp < 0 || warp >= cuda::kGemvWarps) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  *y = nullptr;
  *row = -1;
  if (block < 0 || block >= *n_blocks) return 0;
  const cuda::WarpRow m = cuda::warp_row(t, block, warp);
  if (m.o < m.n_out) *y = m.y, *row = m.o;
  return 0;
}

int quant_unit_q8_share(uint32_t weight_type, const void* row, int32_t unit, bool vector_loads, const int8_t* xq,
                        float d, float s, float* share) {
  if (cuda::block_shape(weight_type).values == 0) return static_cast<int>(cudaErrorInvalidValue);
  return cuda::dispatch<UnitShare>(weight_type, static_cast<const uint8_t*>(row), unit, vector_loads, xq, d, s,
                                   share);
}

}  // namespace helios::kernels
