// Tensor type table and row (de)quantization for the GGUF block formats Helios reads.
// Block layouts follow the GGUF specification; each loop below is the plain per-block formula.
#include "helios/tensor_type.h"

#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_blocks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace helios {
namespace {

// The block layouts, shared with the quantized matmul kernels.
using kernels::BlockQ4_0;
using kernels::BlockQ4_1;
using kernels::BlockQ4_K;
using kernels::BlockQ5_0;
using kernels::BlockQ5_1;
using kernels::BlockQ5_K;
using kernels::BlockQ6_K;
using kernels::BlockQ8_0;
constexpr int64_t kQK = kernels::kQK;    // elements per Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block
constexpr int64_t kQKK = kernels::kQKK;  // elements per K-quant super-block

struct Entry { uint32_t id; TensorTypeTraits traits; };
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},       {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},    {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},    {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},    {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", 256, 84, false}}, {11, {"Q3_K", 256, 110, false}},
    {12, {"Q4_K", 256, 144, true}}, {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}}, {15, {"Q8_K", 256, 292, false}},
    {24, {"I8", 1, 1, false}},      {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},     {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},     {30, {"BF16", 1, 2, true}},
};

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * b[i].qs[j];
  }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * ((b[i].qs[j] & 0xF) - 8);
      y[j + kQK / 2] = d * ((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * (b[i].qs[j] & 0xF) + m;
      y[j + kQK / 2] = d * (b[i].qs[j] >> 4) + m;
    }
  }
}

// Q5_0: the low four bits of each value in qs (as Q4_0), the fifth bit of value j in bit j of qh.
void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, sizeof(qh));
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + kQK / 2)) & 1) << 4);
      y[j] = d * (lo - 16);
      y[j + kQK / 2] = d * (hi - 16);
    }
  }
}

// The 5-bit values of a Q5_1 block: the nibbles of qs plus bit j of qh for element j.
void q5_values(const uint8_t* qs, const uint8_t* qh, int* q) {
  const uint32_t high = kernels::q5_high_bits(qh);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0xF) | static_cast<int>((high >> j) & 1) << 4;
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>((high >> (j + kQK / 2)) & 1) << 4;
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    int q[kQK];
    q5_values(b[i].qs, b[i].qh, q);
    for (int j = 0; j < kQK; ++j) y[j] = d * q[j] + m;
  }
}

// Q4_K, and Q5_K (Q4_K's layout with a fifth bit per value: bit j of qh[l] for element l of
// sub-block j).
template <typename Block>
void dequant_q45_k(const Block* b, float* y, int64_t nb) {
  constexpr bool kFiveBits = std::is_same_v<Block, BlockQ5_K>;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    // 8 sub-blocks of 32; each byte of qs feeds sub-block 2k (low nibble) and 2k+1 (high).
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      kernels::k_quant_scale_min(j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      kernels::k_quant_scale_min(j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int h = 0; h < 2; ++h) {
        const float dh = h ? d2 : d1, mh = h ? m2 : m1;
        for (int l = 0; l < 32; ++l) {
          int v = (q[l] >> (4 * h)) & 0xF;
          if constexpr (kFiveBits) v |= ((b[i].qh[l] >> (j + h)) & 1) << 4;
          *y++ = dh * v - mh;
        }
      }
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    // Two halves of 128; each 6-bit value = 4 low bits from ql + 2 high bits from qh, minus 32.
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void quant_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
  }
}

void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0, max = 0;  // the signed value of largest magnitude maps to -8
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Q4_1 and Q5_1 as llama.cpp's reference quantizers: [min, max] in `steps` steps (15 or 31);
// writes the block's d and m and each element's level q[j] ∈ [0, steps].
template <typename Block>
void quant_min_levels(const float* x, int steps, Block& b, int* q) {
  const auto [mn, mx] = std::minmax_element(x, x + kQK);
  const float d = (*mx - *mn) / static_cast<float>(steps), id = d ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  b.m = fp32_to_fp16(*mn);
  for (int j = 0; j < kQK; ++j) q[j] = std::clamp(static_cast<int>((x[j] - *mn) * id + 0.5f), 0, steps);
}

void quant_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    quant_min_levels(x, 15, b[i], q);
    for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
  }
}

// Q4_K and Q5_K's scales: per sub-block of 32 a min/max fit with levels 0..n_levels, 6-bit
// scales and mins packed into scales[12] (the inverse of k_quant_scale_min); d, dmin stored in
// fp16. Writes each element's level (0..n_levels) into q[256]. Simple, not error-optimal.
template <typename Block>
void quant_k_scales(const float* x, int n_levels, Block& b, uint8_t* q) {
  float scale[8], minv[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const auto [mn, mx] = std::minmax_element(x + 32 * j, x + 32 * j + 32);
    minv[j] = std::max(0.0f, -*mn);  // K-quants subtract a non-negative min
    scale[j] = (*mx + minv[j]) / n_levels;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, minv[j]);
  }
  b.d = fp32_to_fp16(max_scale / 63.0f);
  b.dmin = fp32_to_fp16(max_min / 63.0f);
  const float dq = fp16_to_fp32(b.d), dminq = fp16_to_fp32(b.dmin);
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63L, dq ? std::lround(scale[j] / dq) : 0L));
    lm[j] = static_cast<uint8_t>(std::min(63L, dminq ? std::lround(minv[j] / dminq) : 0L));
  }
  std::memset(b.scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      b.scales[j] = ls[j];
      b.scales[j + 4] = lm[j];
    } else {
      b.scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
      b.scales[j - 4] |= (ls[j] >> 4) << 6;
      b.scales[j] |= (lm[j] >> 4) << 6;
    }
  }
  for (int e = 0; e < kQKK; ++e) {
    const float sd = dq * ls[e / 32], sm = dminq * lm[e / 32];
    const long v = sd ? std::lround((x[e] + sm) / sd) : 0;
    q[e] = static_cast<uint8_t>(std::clamp(v, 0L, static_cast<long>(n_levels)));
  }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    uint8_t q[kQKK];
    quant_k_scales(x, 15, b[i], q);
    for (int j = 0; j < 8; j += 2) {
      for (int l = 0; l < 32; ++l) b[i].qs[16 * j + l] = q[32 * j + l] | (q[32 * (j + 1) + l] << 4);
    }
  }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    uint8_t q[kQKK];
    quant_k_scales(x, 31, b[i], q);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int j = 0; j < 8; j += 2) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = q[32 * j + l], hi = q[32 * (j + 1) + l];
        b[i].qs[16 * j + l] = (lo & 0xF) | ((hi & 0xF) << 4);
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << j) | ((hi >> 4) << (j + 1)));
      }
    }
  }
}

// Q5_0 as llama.cpp's reference quantizer (the value of largest magnitude maps to −16, d = max/−16)
// and Q5_1 as Q4_1 with 31 steps; the fifth bits go to qh.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    high |= static_cast<uint32_t>(q[j] >> 4) << j | static_cast<uint32_t>(q[j + kQK / 2] >> 4) << (j + kQK / 2);
  }
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(high >> (8 * k));
}

void quant_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -16.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = std::clamp(static_cast<int>(x[j] * id + 16.5f), 0, 31);
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    quant_min_levels(x, 31, b[i], q);
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

// A simple Q6_K quantizer: per 16-element group an int8 scale, 6-bit values centred on 32.
void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float group_scale[16], max_abs_scale = 0;
    for (int g = 0; g < 16; ++g) {
      float amax = 0;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * g + l]));
      group_scale[g] = amax / 31.0f;
      max_abs_scale = std::max(max_abs_scale, group_scale[g]);
    }
    const float d = max_abs_scale / 127.0f;
    b[i].d = fp32_to_fp16(d);
    const float dq = fp16_to_fp32(b[i].d);
    int8_t sc[16];
    for (int g = 0; g < 16; ++g) {
      sc[g] = static_cast<int8_t>(std::min(127L, dq ? std::lround(group_scale[g] / dq) : 0L));
      b[i].scales[g] = sc[g];
    }
    uint8_t q[kQKK];
    for (int e = 0; e < kQKK; ++e) {
      const float s = dq * sc[e / 16];
      const long v = s ? std::lround(x[e] / s) : 0;
      q[e] = static_cast<uint8_t>(std::clamp(v, -32L, 31L) + 32);
    }
    std::memset(b[i].ql, 0, sizeof b[i].ql);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    // Inverse of the layout in dequant_q6_k.
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = b[i].ql + 64 * half;
      uint8_t* qh = b[i].qh + 32 * half;
      const uint8_t* qq = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = (qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4);
        ql[l + 32] = (qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4);
        qh[l] = (qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                ((qq[l + 96] >> 4) << 6);
      }
    }
  }
}

}  // namespace

std::optional<TensorTypeTraits> tensor_type_traits(uint32_t type_id) {
  for (const auto& e : kTypes) {
    if (e.id == type_id) return e.traits;
  }
  return std::nullopt;
}

const char* tensor_type_name(TensorType type) {
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  return traits ? traits->name : "unknown";
}

std::optional<TensorType> tensor_type_from_name(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& e : kTypes) {
    if (upper == e.traits.name) return static_cast<TensorType>(e.id);
  }
  return std::nullopt;
}

int64_t tensor_row_bytes(TensorType type, int64_t n) {
  auto t = tensor_type_traits(static_cast<uint32_t>(type));
  assert(t && n % t->block_elems == 0);
  return n / t->block_elems * t->block_bytes;
}

Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  if (!traits || !traits->can_dequantize) {
    return unimplemented(std::string("cannot dequantize tensor type ") + tensor_type_name(type) +
                         " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  }
  if (n % traits->block_elems != 0) {
    return invalid_argument("row of " + std::to_string(n) + " elements is not a multiple of the " +
                            traits->name + " block size " + std::to_string(traits->block_elems));
  }
  const int64_t nb = n / traits->block_elems;
  switch (type) {
    case TensorType::kF32: std::memcpy(dst, src, n * sizeof(float)); break;
    case TensorType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      break;
    }
    case TensorType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      break;
    }
    case TensorType::kQ8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); break;
    case TensorType::kQ4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); break;
    case TensorType::kQ4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); break;
    case TensorType::kQ5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); break;
    case TensorType::kQ5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); break;
    case TensorType::kQ4_K: dequant_q45_k(static_cast<const BlockQ4_K*>(src), dst, nb); break;
    case TensorType::kQ5_K: dequant_q45_k(static_cast<const BlockQ5_K*>(src), dst, nb); break;
    case TensorType::kQ6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); break;
    default: return internal_error("dequantize_row: unhandled type");
  }
  return ok_status();
}

Status quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  if (!traits || n % traits->block_elems != 0) {
    return invalid_argument(std::string("cannot write ") + std::to_string(n) + " elements as " +
                            tensor_type_name(type));
  }
  const int64_t nb = n / traits->block_elems;
  switch (type) {
    case TensorType::kF32: std::memcpy(dst, src, n * sizeof(float)); break;
    case TensorType::kF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      break;
    }
    case TensorType::kBF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      break;
    }
    case TensorType::kQ8_0: quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); break;
    case TensorType::kQ4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); break;
    case TensorType::kQ4_1: quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb); break;
    case TensorType::kQ5_0: quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb); break;
    case TensorType::kQ5_1: quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb); break;
    case TensorType::kQ4_K: quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); break;
    case TensorType::kQ5_K: quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb); break;
    case TensorType::kQ6_K: quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); break;
    default:
      return unimplemented(std::string("cannot write tensor type ") + tensor_type_name(type) +
                           " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  }
  return ok_status();
}

float fp16_to_fp32(uint16_t h) { return kernels::fp16_to_fp32(h); }
uint16_t fp32_to_fp16(float f) { return kernels::fp32_to_fp16(f); }

float bf16_to_fp32(uint16_t h) { return kernels::bf16_to_fp32(h); }
uint16_t fp32_to_bf16(float f) { return kernels::fp32_to_bf16(f); }

}  // namespace helios
