// GGUF's quantized block layouts (as ggml-common.h defines them), shared by the quantized
// matmul kernels and by helios's (de)quantization in src/gguf/tensor_type.cpp.
#pragma once

#include <cstdint>

namespace helios::kernels {

constexpr int kQK = 32;    // values per Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q8_1 block
constexpr int kQKK = 256;  // values per K-quant super-block

// x = d·q
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
// x = d·q, and s = d·Σq (the activation format of the weight types with a minimum)
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[kQK]; };
// x = d·(q − 8); element j < 16 in the low nibble of qs[j], element j + 16 in its high nibble
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
// x = d·q + m
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };
// x = d·(q − 16), q of 5 bits: 4 as in Q4_0, the fifth of element j is bit j of qh
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
// x = d·q + m, q of 5 bits as in Q5_0
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };

// K-quants: a super-block of 256 values in 8 sub-blocks of 32 (Q4_K, Q5_K) or 16 of 16 (Q6_K).
// Q4_K: x = d·sc_j·q − dmin·m_j in sub-block j; sc_j, m_j are 6 bits packed in `scales`
// (k_quant_scale_min). Byte l of qs[32k .. 32k+32) holds element l of sub-block 2k (low nibble)
// and of sub-block 2k+1 (high nibble).
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[kQKK / 2]; };
// Q5_K: Q4_K's layout plus a fifth bit: bit j of qh[l] for element l of sub-block j.
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[kQKK / 8]; uint8_t qs[kQKK / 2]; };
// Q6_K: x = d·scales[g]·(q − 32) in group g of 16; q = 4 bits from ql and 2 from qh. In each half
// of 128: elements l, l+32, l+64, l+96 (l < 32) are the low nibbles of ql[l], ql[l+32], the high
// nibbles of ql[l], ql[l+32], and bits 0-1, 2-3, 4-5, 6-7 of qh[l].
struct BlockQ6_K { uint8_t ql[kQKK / 2]; uint8_t qh[kQKK / 4]; int8_t scales[kQKK / 16]; uint16_t d; };
// The activations of the K-quant products: x = d·q, and bsums[g] = Σq over group g of 16.
struct BlockQ8_K { float d; int8_t qs[kQKK]; int16_t bsums[kQKK / 16]; };

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36 && sizeof(BlockQ4_0) == 18 &&
              sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

// Scale and min of sub-block j (0..7) of a Q4_K or Q5_K super-block: 6 bits each, the first four
// in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), the last four in the nibbles of bytes
// 8-11 with their top 2 bits in the top bits of bytes 0-7.
inline void k_quant_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The fifth bits of a Q5_0/Q5_1 block as a 32-bit word (bit j for element j).
inline uint32_t q5_high_bits(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

}  // namespace helios::kernels
