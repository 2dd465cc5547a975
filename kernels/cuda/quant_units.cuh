// GGUF's quantized blocks as the CUDA kernels read them (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K), a row at a time in units of 32 values: the loads, and one unit decoded either to floats
// (Quant: the host's dequantize_row operations; on the device a multiply and add may fuse, moving
// a value by an ulp) or to 8-bit integers with the scales that turn their products with 8-bit
// activations into the unit's share of a dot product (IntUnit). Q4_K and Q5_K units are read with
// 16-byte loads when the weights' rows are 16-byte aligned (their blocks are 144 and 176 bytes);
// everything else in aligned four-byte words shifted together where a stretch sits 2 bytes into
// one (every block is 2-byte aligned). All of it is host-callable, so tests check it on machines
// without a GPU.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/ref/quant_blocks.h"

namespace helios::kernels::cuda {

constexpr int kUnit = 32;  // values a thread decodes at once

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

// The N bytes at p (2-byte aligned, N a multiple of 4) as N/4 little-endian words, in N/4 + 1
// aligned four-byte loads, each pair shifted together when p sits 2 bytes into a word: about half
// the loads of load_pairs, and the same instructions whichever way a lane's block sits (no
// divergence). Every word read holds a byte of the stretch, so none leaves an allocation of whole
// 4-byte words from a 4-byte aligned start (the backend's buffers).
template <int N>
HD void load_words(const uint8_t* __restrict__ p, uint32_t (&out)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
  const auto skew = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 2);  // 0 or 2
  const auto* w = reinterpret_cast<const uint32_t*>(p - skew);
  const unsigned shift = skew * 8;
  uint32_t lo = read_only(w);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    // The last word's successor is read only when shifted (else the last word again, unused).
    const uint32_t hi = read_only(w + (i + 1 < N / 4 ? i + 1 : N / 4 - 1 + shift / 16));
    out[i] = funnel_right(lo, hi, shift);
    lo = hi;
  }
}

// The words' bytes, in order.
template <int N>
HD void word_bytes(const uint32_t (&words)[N / 4], uint8_t (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
}

template <int N>
HD void load_words(const uint8_t* __restrict__ p, uint8_t (&out)[N]) {
  uint32_t words[N / 4];
  load_words<N>(p, words);
  word_bytes<N>(words, out);
}

// The 32 bytes at p as 8 words: two 16-byte loads when p is 16-byte aligned (kVector), else
// load_words.
template <bool kVector>
HD void load32(const uint8_t* __restrict__ p, uint32_t (&out)[8]) {
  if constexpr (kVector) {
    const auto* v = reinterpret_cast<const uint4*>(p);
    const uint4 a = read_only(v), b = read_only(v + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    load_words<32>(p, out);
  }
}

template <bool kVector>
HD void load32(const uint8_t* __restrict__ p, uint8_t (&out)[32]) {
  uint32_t words[8];
  load32<kVector>(p, words);
  word_bytes<32>(words, out);
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

HD uint32_t high_bits(const uint8_t* qh) {
  uint8_t b[4];
  load_pairs(qh, b);
  return b[0] | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
         static_cast<uint32_t>(b[3]) << 24;
}

// Q4_0, Q4_1 (kOffset 0: x = d·q + m), Q5_0 and Q5_1 (kFive; otherwise x = d·(q − kOffset)): value
// j < 16 in the low nibble of byte j, j + 16 in its high nibble, the fifth bit of value j bit j of
// qh.
template <typename Block, bool kFive, int kOffset>
struct Quant32 {
  template <bool kVector>
  HD static void unit(const uint8_t* __restrict__ row, int32_t u, float* v) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    const float d = half_at(b.d);
    float m = 0.0f;
    if constexpr (kOffset == 0) m = half_at(b.m);
    uint32_t qh = 0;
    if constexpr (kFive) qh = high_bits(b.qh);
    uint8_t qs[kUnit / 2];
    load_words(b.qs, qs);
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      int lo = qs[j] & 0xF, hi = qs[j] >> 4;
      if constexpr (kFive) {
        lo |= static_cast<int>((qh >> j) & 1) << 4;
        hi |= static_cast<int>((qh >> (j + 16)) & 1) << 4;
      }
      if constexpr (kOffset == 0) {
        v[j] = d * lo + m;
        v[j + kUnit / 2] = d * hi + m;
      } else {
        v[j] = d * (lo - kOffset);
        v[j + kUnit / 2] = d * (hi - kOffset);
      }
    }
  }
};
template <>
struct Quant<kWeightQ4_0> : Quant32<BlockQ4_0, false, 8> {};
template <>
struct Quant<kWeightQ4_1> : Quant32<BlockQ4_1, false, 0> {};
template <>
struct Quant<kWeightQ5_0> : Quant32<BlockQ5_0, true, 16> {};
template <>
struct Quant<kWeightQ5_1> : Quant32<BlockQ5_1, true, 0> {};

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


// --- Units as 8-bit integers.

// A unit of weights as integers: word i holds values 4i..4i+3, one signed byte each. With an
// activation unit x in 8 bits (scale d_x, and s_x = d_x·Σx), the unit's share of the dot product
// is d·d_x·(sc[0]·Σ_{values < 16} w·x + sc[1]·Σ_{values ≥ 16} w·x) + m·s_x.
struct IntUnit {
  uint32_t q[8];
  int32_t sc[2] = {1, 1};
  float d = 0.0f, m = 0.0f;
};

// Per byte: the low nibble, the high nibble; v − k for bytes v with v + 128 − k < 256 (signed bytes
// out, no borrow between bytes); bit b of t (b < 4) as bit 0 of byte b.
HD uint32_t low_nibbles(uint32_t w) { return w & 0x0F0F0F0Fu; }
HD uint32_t high_nibbles(uint32_t w) { return (w >> 4) & 0x0F0F0F0Fu; }
template <int K>
HD uint32_t minus(uint32_t w) { return (w + (128u - K) * 0x01010101u) ^ 0x80808080u; }
HD uint32_t spread_bits4(uint32_t t) { return ((t & 0xFu) * 0x00204081u) & 0x01010101u; }

// Σ of the four signed byte products of a and b, plus c (dp4a on the device).
HD int32_t dot4(uint32_t a, uint32_t b, int32_t c) {
#ifdef __CUDA_ARCH__
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k) c += static_cast<int8_t>(a >> (8 * k)) * static_cast<int8_t>(b >> (8 * k));
  return c;
#endif
}

// QuantInts<type>: kMin (the share has an m·s_x term), kScaled (sc is not {1, 1}), and
// unit<kVector>(row, u): values [32u, 32u + 32) of a row.
template <uint32_t kType>
struct QuantInts;

template <>
struct QuantInts<kWeightQ8_0> {
  static constexpr bool kMin = false, kScaled = false;
  template <bool kVector>
  HD static IntUnit unit(const uint8_t* __restrict__ row, int32_t u) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[u];
    IntUnit w;
    load_words<kUnit>(reinterpret_cast<const uint8_t*>(b.qs), w.q);
    w.d = half_at(b.d);
    return w;
  }
};

// Q4_0, Q4_1 (kOffset 0, a minimum), Q5_0 and Q5_1 (kFive): value j < 16 in the low nibble of
// byte j, j + 16 in its high nibble, the fifth bit of value j bit j of qh.
template <typename Block, bool kFive, int kOffset>
struct QuantInts32 {
  static constexpr bool kMin = kOffset == 0, kScaled = false;
  template <bool kVector>
  HD static IntUnit unit(const uint8_t* __restrict__ row, int32_t u) {
    const Block& b = reinterpret_cast<const Block*>(row)[u];
    uint32_t qs[4];
    load_words<kUnit / 2>(b.qs, qs);
    uint32_t qh = 0;
    if constexpr (kFive) qh = high_bits(b.qh);
    IntUnit w;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t lo = low_nibbles(qs[i]), hi = high_nibbles(qs[i]);
      if constexpr (kFive) {
        lo |= spread_bits4(qh >> (4 * i)) << 4;
        hi |= spread_bits4(qh >> (16 + 4 * i)) << 4;
      }
      w.q[i] = minus<kOffset>(lo);
      w.q[i + 4] = minus<kOffset>(hi);
    }
    w.d = half_at(b.d);
    if constexpr (kMin) w.m = half_at(b.m);
    return w;
  }
};
template <>
struct QuantInts<kWeightQ4_0> : QuantInts32<BlockQ4_0, false, 8> {};
template <>
struct QuantInts<kWeightQ4_1> : QuantInts32<BlockQ4_1, false, 0> {};
template <>
struct QuantInts<kWeightQ5_0> : QuantInts32<BlockQ5_0, true, 16> {};
template <>
struct QuantInts<kWeightQ5_1> : QuantInts32<BlockQ5_1, true, 0> {};

// Q4_K and Q5_K: unit j of a super-block is sub-block j, x = d·sc_j·q − dmin·m_j.
template <typename Block, bool kFive>
struct QuantIntsK45 {
  static constexpr bool kMin = true, kScaled = true;
  template <bool kVector>
  HD static IntUnit unit(const uint8_t* __restrict__ row, int32_t u) {
    const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
    const int j = u % 8;
    int sc, mn;
    scale_min(j, b.scales, &sc, &mn);
    uint32_t qs[8], qh[8];
    load32<kVector>(b.qs + 32 * (j / 2), qs);
    if constexpr (kFive) load32<kVector>(b.qh, qh);
    IntUnit w;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w.q[i] = j % 2 ? high_nibbles(qs[i]) : low_nibbles(qs[i]);
      if constexpr (kFive) w.q[i] |= ((qh[i] >> j) & 0x01010101u) << 4;
    }
    w.sc[0] = w.sc[1] = sc;
    w.d = half_at(b.d);
    w.m = -half_at(b.dmin) * static_cast<float>(mn);
    return w;
  }
};
template <>
struct QuantInts<kWeightQ4_K> : QuantIntsK45<BlockQ4_K, false> {};
template <>
struct QuantInts<kWeightQ5_K> : QuantIntsK45<BlockQ5_K, true> {};

// Q6_K: unit k of a super-block is elements [32k, 32k + 32), two groups of 16 with a scale each.
template <>
struct QuantInts<kWeightQ6_K> {
  static constexpr bool kMin = false, kScaled = true;
  template <bool kVector>
  HD static IntUnit unit(const uint8_t* __restrict__ row, int32_t u) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int half = (u % 8) / 4, quarter = u % 4;
    uint32_t ql[8], qh[8];
    uint8_t sc[2];
    load_words<kUnit>(b.ql + 64 * half + 32 * (quarter % 2), ql);
    load_words<kUnit>(b.qh + 32 * half, qh);
    load_pairs(reinterpret_cast<const uint8_t*>(b.scales) + 8 * half + 2 * quarter, sc);
    IntUnit w;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t low = quarter >= 2 ? high_nibbles(ql[i]) : low_nibbles(ql[i]);
      w.q[i] = minus<32>(low | ((qh[i] >> (2 * quarter)) & 0x03030303u) << 4);
    }
    w.sc[0] = static_cast<int8_t>(sc[0]);
    w.sc[1] = static_cast<int8_t>(sc[1]);
    w.d = half_at(b.d);
    return w;
  }
};

// The unit's share of a dot product with an activation unit x (8 words), d_x and s_x.
template <uint32_t kType>
HD float unit_share(const IntUnit& w, const uint32_t (&x)[8], float d_x, float s_x) {
  int32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo = dot4(w.q[i], x[i], lo);
    hi = dot4(w.q[i + 4], x[i + 4], hi);
  }
  const int32_t sum = QuantInts<kType>::kScaled ? w.sc[0] * lo + w.sc[1] * hi : lo + hi;
  const float share = w.d * d_x * static_cast<float>(sum);
  return QuantInts<kType>::kMin ? fmaf(w.m, s_x, share) : share;
}

// --- Host-side dispatch.

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

// Values and bytes of one block of a weight type (0 for a type these kernels do not read).
struct BlockShape {
  int32_t values = 0, bytes = 0;
};
inline BlockShape block_shape(uint32_t weight_type) {
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

// The bytes of a row of n_in values, or 0 when the type or the width is not one these kernels read.
inline int64_t row_bytes_of(uint32_t weight_type, int32_t n_in) {
  const BlockShape b = block_shape(weight_type);
  if (b.values == 0 || n_in <= 0 || n_in % b.values != 0) return 0;
  return static_cast<int64_t>(n_in / b.values) * b.bytes;
}

}  // namespace helios::kernels::cuda
