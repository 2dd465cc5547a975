// Activations rounded to 8 bits on the device, as ref_quantize_activations rounds them for a weight
// type (its Q8_1 or Q8_K), a unit of 32 values per thread: by the rounding launch of the 8-bit
// matrix-vector path (matmul_q8.cu), and by the launches that write a product's input (rmsnorm.cu,
// elementwise.cu), which round it as they write it instead of leaving it to one more launch.
// Host-callable where it can be, so tests check it on machines without a GPU.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_units.cuh"
#include "kernels/kernels.h"

namespace helios::kernels::cuda {

// The 8-bit rounding the weight type's products take (ref_quantize_activations): Q8_1 for the
// 32-value blocks (Q8_0's integers and scale are Q8_1's; Q8_0 only lacks s, which those types
// do not read), Q8_K for the K-quants.
enum class Act { kQ8_1, kQ8_K };
constexpr Act act_of(uint32_t weight_type) {
  return weight_type == kWeightQ4_K || weight_type == kWeightQ5_K || weight_type == kWeightQ6_K ? Act::kQ8_K
                                                                                                 : Act::kQ8_1;
}
// Units that share one scale: Q8_K's 256-value blocks, the others' 32.
template <Act kAct>
constexpr int kUnitsPerScale = kAct == Act::kQ8_K ? kQKK / kUnit : 1;

// The value of largest magnitude and its index; the first of equals, as the CPU's scan keeps it
// (a NaN never wins, as there).
struct Peak {
  float amax = 0.0f, value = 0.0f;
  int32_t index = INT_MAX;
};
HD Peak unit_peak(const float* x, int32_t first_index) {
  Peak p;
  for (int j = 0; j < kUnit; ++j) {
    const float ax = fabsf(x[j]);
    if (ax > p.amax) p = {ax, x[j], first_index + j};
  }
  return p;
}
// Of two peaks, the larger, or the earlier of equals: the same whichever way round.
HD Peak larger(const Peak& a, const Peak& b) {
  return b.amax > a.amax || (b.amax == a.amax && b.index < a.index) ? b : a;
}

HD int32_t round_even(float x) {
#ifdef __CUDA_ARCH__
  return __float2int_rn(x);
#else
  return static_cast<int32_t>(std::nearbyint(x));
#endif
}
HD float through_half(float x) { return __half2float(__float2half_rn(x)); }

// A unit's bytes (4 per word) and (d, s) from its scale group's peak, with
// ref_quantize_activations' operations: Q8_1 q = round(x·127/amax), d = amax/127 kept as a half,
// s = d·Σq from d before rounding, as a half; Q8_K q = min(127, round(x·(−127/max))),
// d = 1/(−127/max), s = d·Σq, a block of zeros when amax is 0.
template <Act kAct>
HD float2 quantize_unit(const float* x, const Peak& p, uint32_t (&q)[8]) {
  float mul, d;
  if constexpr (kAct == Act::kQ8_K) {
    mul = p.amax != 0.0f ? -127.0f / p.value : 0.0f;
    d = p.amax != 0.0f ? 1.0f / mul : 0.0f;
  } else {
    mul = p.amax != 0.0f ? 127.0f / p.amax : 0.0f;
    d = p.amax / 127.0f;
  }
  int32_t sum = 0;
  for (int i = 0; i < 8; ++i) {
    uint32_t word = 0;
    for (int k = 0; k < 4; ++k) {
      int32_t v = round_even(x[4 * i + k] * mul);
      if constexpr (kAct == Act::kQ8_K) v = v < 127 ? v : 127;
      sum += v;
      word |= static_cast<uint32_t>(v & 0xFF) << (8 * k);
    }
    q[i] = word;
  }
  if constexpr (kAct == Act::kQ8_K) return {d, d * static_cast<float>(sum)};
  return {through_half(d), through_half(d * static_cast<float>(sum))};
}

// Where a workspace keeps rounded row r: its n_in bytes, then a (d, s) pair per unit; each row
// starts 16-byte aligned, so any first rows of a workspace are a workspace of their own.
struct Q8Rows {
  uint8_t* base;
  int32_t n_in;
  int64_t stride;
  HD int8_t* q(int64_t r) const { return reinterpret_cast<int8_t*>(base + r * stride); }
  HD float2* ds(int64_t r) const { return reinterpret_cast<float2*>(base + r * stride + n_in); }
};
HD int64_t q8_row_stride(int32_t n_in) {
  return (static_cast<int64_t>(n_in) + n_in / kUnit * static_cast<int64_t>(sizeof(float2)) + 15) / 16 * 16;
}
inline Q8Rows q8_rows(const void* workspace, int32_t n_in) {
  return {static_cast<uint8_t*>(const_cast<void*>(workspace)), n_in, q8_row_stride(n_in)};
}

// The checks every entry point makes: a type read in its blocks, whole blocks, a workspace that
// holds the rows.
inline bool q8_args_ok(uint32_t weight_type, int32_t n_rows, int32_t n_in, const void* workspace,
                       size_t workspace_bytes) {
  return row_bytes_of(weight_type, n_in) != 0 && workspace && reinterpret_cast<uintptr_t>(workspace) % 16 == 0 &&
         workspace_bytes >= matmul_quant_q8_workspace_bytes(n_rows, n_in);
}

// f(std::integral_constant<Act, A>{}) for the weight type's rounding A.
template <typename F>
int with_act(uint32_t weight_type, F&& f) {
  if (act_of(weight_type) == Act::kQ8_K) return f(std::integral_constant<Act, Act::kQ8_K>{});
  return f(std::integral_constant<Act, Act::kQ8_1>{});
}

// Unit k of row r, holding v, rounded into `rows`. Every lane of the warp calls it, with a unit
// (`active`) or without: a scale group's units are consecutive lanes of one warp (8 divides 32, and
// a row holds whole groups), which share their peaks with xor shuffles.
template <Act kAct>
__device__ __forceinline__ void round_unit(const float (&v)[kUnit], bool active, int64_t r, int32_t k,
                                           const Q8Rows& rows) {
  constexpr int kGroup = kUnitsPerScale<kAct>;
  Peak p = unit_peak(v, (k % kGroup) * kUnit);
  for (int o = 1; o < kGroup; o <<= 1) {
    const Peak other{__shfl_xor_sync(kFullMask, p.amax, o), __shfl_xor_sync(kFullMask, p.value, o),
                     __shfl_xor_sync(kFullMask, p.index, o)};
    p = larger(p, other);
  }
  if (!active) return;
  uint32_t words[8];
  const float2 scales = quantize_unit<kAct>(v, p, words);
  auto* out = reinterpret_cast<uint4*>(rows.q(r) + static_cast<int64_t>(k) * kUnit);
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[1] = make_uint4(words[4], words[5], words[6], words[7]);
  rows.ds(r)[k] = scales;
}

// Row r, just written to `row` by this block (a multiple of 32 threads), rounded by the block.
// Plain loads: the read-only cache may hold what `row` held before this launch.
template <Act kAct>
__device__ void round_row(const float* row, const Q8Rows& rows, int64_t r) {
  __syncthreads();
  const int32_t n_units = rows.n_in / kUnit;
  for (int32_t first = 0; first < n_units; first += blockDim.x) {
    const int32_t k = first + threadIdx.x;
    const bool active = k < n_units;
    float v[kUnit] = {};
    if (active) {
      for (int j = 0; j < kUnit; ++j) v[j] = row[static_cast<int64_t>(k) * kUnit + j];
    }
    round_unit<kAct>(v, active, r, k, rows);
  }
}

}  // namespace helios::kernels::cuda
