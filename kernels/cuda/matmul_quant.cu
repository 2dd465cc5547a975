// Quantized weights read in their GGUF blocks: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K.
// A row is walked in units of 32 values; a unit is dequantized in registers with the host's
// dequantize_row float operations (on the device a multiply and add may fuse, moving a value by
// an ulp), and applied to f32 activations. For a
// few rows (decode) a block stages the activations in shared memory and one warp per output row
// applies each unit to all of them, 1 to 8 rows in one launch, so the bytes read per token are the
// file's; for more rows the weights are dequantized to f16 a slice
// at a time for cuBLAS (launch_dequantize_f16). Q4_K and Q5_K units are read with 16-byte loads
// when the weights' rows are 16-byte aligned (their blocks are 144 and 176 bytes); everything
// else in aligned four-byte words shifted together where a stretch sits 2 bytes into one (every
// block is 2-byte aligned). The decoders are host-callable too:
// decode_quant_unit runs them on the CPU, so a test checks their bits against the host's
// dequantize_row on machines without a GPU.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"
#include "kernels/ref/quant_blocks.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;  // 8 warps, 8 output rows per block
constexpr int kUnit = 32;      // values a thread decodes at once

#define HD __host__ __device__ __forceinline__

// Weight bytes through the read-only data cache on the device. Explicit: load_words' address
// arithmetic hides from the compiler that the weights are read-only, for every load near it.
template <typename T>
HD T read_only(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

HD float half_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
HD float half_at(const uint16_t& h) { return half_bits(read_only(&h)); }

// The N bytes at p into registers in N/2 two-byte loads: every block is 2-byte aligned (its
// scales are halves), so any stretch at an even offset of one is too.
template <int N>
HD void load_pairs(const uint8_t* __restrict__ p, uint8_t (&out)[N]) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const uint16_t x = read_only(h + i);
    out[2 * i] = static_cast<uint8_t>(x);
    out[2 * i + 1] = static_cast<uint8_t>(x >> 8);
  }
}

// hi:lo shifted right by `shift` bits (0 or 16), the low word.
HD uint32_t funnel_right(uint32_t lo, uint32_t hi, unsigned shift) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(hi) << 32 | lo) >> shift);
#endif
}

// The N bytes at p (2-byte aligned, N a multiple of 4) into registers in N/4 + 1 aligned four-byte
// loads, each pair shifted together when p sits 2 bytes into a word: about half the loads of
// load_pairs, and the same instructions whichever way a lane's block sits (no divergence). Every
// word read holds a byte of the stretch, so none leaves an allocation of whole 4-byte words from
// a 4-byte aligned start (the backend's buffers).
template <int N>
HD void load_words(const uint8_t* __restrict__ p, uint8_t (&out)[N]) {
  static_assert(N % 4 == 0, "whole words");
  const auto skew = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 2);  // 0 or 2
  const auto* w = reinterpret_cast<const uint32_t*>(p - skew);
  const unsigned shift = skew * 8;
  uint32_t lo = read_only(w);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    // The last word's successor is read only when shifted (else the last word again, unused).
    const uint32_t hi = read_only(w + (i + 1 < N / 4 ? i + 1 : N / 4 - 1 + shift / 16));
    const uint32_t x = funnel_right(lo, hi, shift);
#pragma unroll
    for (int k = 0; k < 4; ++k) out[4 * i + k] = static_cast<uint8_t>(x >> (8 * k));
    lo = hi;
  }
}

// The 32 bytes at p into registers: two 16-byte loads when p is 16-byte aligned (kVector), else
// load_words.
template <bool kVector>
HD void load32(const uint8_t* __restrict__ p, uint8_t (&out)[32]) {
  if constexpr (kVector) {
    const auto* v = reinterpret_cast<const uint4*>(p);
    const uint4 a = read_only(v), b = read_only(v + 1);
    const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
  } else {
    load_words(p, out);
  }
}

// Scale and minimum of sub-block j of a Q4_K/Q5_K super-block (k_quant_scale_min's bits).
HD void scale_min(int j, const uint8_t* q, int* sc, int* m) {
  const int here = read_only(q + j), above = read_only(q + j + 4);
  if (j < 4) {
    *sc = here & 63;
    *m = above & 63;
  } else {
    *sc = (above & 0xF) | ((read_only(q + j - 4) >> 6) << 4);
    *m = (above >> 4) | ((here >> 6) << 4);
  }
}

// Quant<type>::unit(row, u, v): values [32u, 32u + 32) of a row into v.
template <uint32_t kType>
struct Quant;

template <>
struct Quant<kWeightQ8_0> {
  using Block = BlockQ8_0;
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d);
    uint8_t qs[kUnit];
    load_words(reinterpret_cast<const uint8_t*>(b.qs), qs);
#pragma unroll
    for (int j = 0; j < kUnit; ++j) v[j] = d * static_cast<int8_t>(qs[j]);
  }
};

template <>
struct Quant<kWeightQ4_0> {
  using Block = BlockQ4_0;
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d);
    uint8_t qs[kUnit / 2];
    load_words(b.qs, qs);
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      v[j] = d * ((qs[j] & 0xF) - 8);
      v[j + kUnit / 2] = d * ((qs[j] >> 4) - 8);
    }
  }
};

template <>
struct Quant<kWeightQ4_1> {
  using Block = BlockQ4_1;
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d), m = half_at(b.m);
    uint8_t qs[kUnit / 2];
    load_words(b.qs, qs);
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      v[j] = d * (qs[j] & 0xF) + m;
      v[j + kUnit / 2] = d * (qs[j] >> 4) + m;
    }
  }
};

HD uint32_t high_bits(const uint8_t* qh) {
  uint8_t b[4];
  load_pairs(qh, b);
  return b[0] | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
         static_cast<uint32_t>(b[3]) << 24;
}

template <>
struct Quant<kWeightQ5_0> {
  using Block = BlockQ5_0;
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d);
    const uint32_t qh = high_bits(b.qh);
    uint8_t qs[kUnit / 2];
    load_words(b.qs, qs);
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      v[j] = d * (static_cast<int>((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
      v[j + kUnit / 2] = d * (static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
  }
};

template <>
struct Quant<kWeightQ5_1> {
  using Block = BlockQ5_1;
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d), m = half_at(b.m);
    const uint32_t qh = high_bits(b.qh);
    uint8_t qs[kUnit / 2];
    load_words(b.qs, qs);
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      v[j] = d * static_cast<int>((qs[j] & 0xF) | ((qh >> j) & 1) << 4) + m;
      v[j + kUnit / 2] = d * static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + m;
    }
  }
};

// Q4_K and Q5_K: unit j of a super-block is sub-block j (x = d·sc·q − dmin·m). Their quants
// (and Q5_K's high bits) sit at 16-byte offsets of the block, so aligned rows allow kVector.
template <typename Block, bool kFiveBits>
struct QuantK45 {
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
    const int j = u % 8, h = j % 2;
    int sc, m;
    scale_min(j, b.scales, &sc, &m);
    const float dh = half_at(b.d) * sc, mh = half_at(b.dmin) * m;
    uint8_t q[32], qh[32];
    load32<kVector>(b.qs + 32 * (j / 2), q);
    if constexpr (kFiveBits) load32<kVector>(b.qh, qh);
#pragma unroll
    for (int l = 0; l < kUnit; ++l) {
      int x = (q[l] >> (4 * h)) & 0xF;
      if constexpr (kFiveBits) x |= ((qh[l] >> j) & 1) << 4;
      v[l] = dh * x - mh;
    }
  }
};
template <>
struct Quant<kWeightQ4_K> : QuantK45<BlockQ4_K, false> {};
template <>
struct Quant<kWeightQ5_K> : QuantK45<BlockQ5_K, true> {};
// Types whose unit<true> reads 16-byte aligned stretches when the row itself is aligned.
template <uint32_t kType>
constexpr bool kVectorizable = kType == kWeightQ4_K || kType == kWeightQ5_K;

// Q6_K: unit k of a super-block is elements [32k, 32k + 32): quarter k % 4 of half k / 4.
template <>
struct Quant<kWeightQ6_K> {
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int half = (u % 8) / 4, quarter = u % 4;
    const float d = half_at(b.d);
    uint8_t ql[kUnit], qh[kUnit], sc[2];
    load_words(b.ql + 64 * half + 32 * (quarter % 2), ql);
    load_words(b.qh + 32 * half, qh);
    load_pairs(reinterpret_cast<const uint8_t*>(b.scales) + 8 * half + 2 * quarter, sc);
#pragma unroll
    for (int l = 0; l < kUnit; ++l) {
      const int low = quarter >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
      const int q = static_cast<int8_t>(low | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
      v[l] = d * static_cast<int8_t>(sc[l / 16]) * q;
    }
  }
};

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

// f(std::bool_constant<kVector>{}): vector loads where the type allows them and every row of w
// starts at a 16-byte boundary.
template <uint32_t kType, typename F>
void with_loads(const uint8_t* w, int64_t row_bytes, F&& f) {
  if constexpr (kVectorizable<kType>) {
    if ((reinterpret_cast<uintptr_t>(w) | static_cast<uintptr_t>(row_bytes)) % 16 == 0) {
      f(std::true_type{});
      return;
    }
  }
  f(std::false_type{});
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

// Op<kType>::run(args...) for a runtime weight type; cudaErrorInvalidValue for others.
template <template <uint32_t> class Op, typename... Args>
int dispatch(uint32_t weight_type, Args... args) {
  switch (weight_type) {
    case kWeightQ8_0: return Op<kWeightQ8_0>::run(args...);
    case kWeightQ4_0: return Op<kWeightQ4_0>::run(args...);
    case kWeightQ4_1: return Op<kWeightQ4_1>::run(args...);
    case kWeightQ5_0: return Op<kWeightQ5_0>::run(args...);
    case kWeightQ5_1: return Op<kWeightQ5_1>::run(args...);
    case kWeightQ4_K: return Op<kWeightQ4_K>::run(args...);
    case kWeightQ5_K: return Op<kWeightQ5_K>::run(args...);
    case kWeightQ6_K: return Op<kWeightQ6_K>::run(args...);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
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

// Values and bytes of one block of a weight type (0 for a type this file does not read).
struct BlockShape {
  int32_t values = 0, bytes = 0;
};
BlockShape block_shape(uint32_t weight_type) {
  switch (weight_type) {
    case kWeightQ8_0: return {kQK, sizeof(BlockQ8_0)};
    case kWeightQ4_0: return {kQK, sizeof(BlockQ4_0)};
    case kWeightQ4_1: return {kQK, sizeof(BlockQ4_1)};
    case kWeightQ5_0: return {kQK, sizeof(BlockQ5_0)};
    case kWeightQ5_1: return {kQK, sizeof(BlockQ5_1)};
    case kWeightQ4_K: return {kQKK, sizeof(BlockQ4_K)};
    case kWeightQ5_K: return {kQKK, sizeof(BlockQ5_K)};
    case kWeightQ6_K: return {kQKK, sizeof(BlockQ6_K)};
    default: return {};
  }
}

// The bytes of a row of n_in values, or 0 when the type or the width is not one this reads.
int64_t row_bytes_of(uint32_t weight_type, int32_t n_in) {
  const BlockShape b = block_shape(weight_type);
  if (b.values == 0 || n_in <= 0 || n_in % b.values != 0) return 0;
  return static_cast<int64_t>(n_in / b.values) * b.bytes;
}

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
