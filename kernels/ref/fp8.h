// OCP FP8 E4M3 ("e4m3fn", what CUDA's __nv_fp8_e4m3 holds) <-> float: 1 sign, 4 exponent bits
// (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN, the largest finite value is 448.
// Encoding rounds to nearest even and saturates to ±448 (CUDA's __NV_SATFINITE), NaN to 0x7F;
// decoding is exact (a table of the 256 codes).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace helios::kernels {

inline float fp8_e4m3_decode(uint8_t b) {
  const int exp = (b >> 3) & 0xF, man = b & 7;
  float v;
  if (exp == 0xF && man == 7) {
    v = std::nanf("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 · 2^-6
  } else {
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return (b & 0x80) ? -v : v;
}

// The 256 codes as floats, for table lookups (scalar and AVX2 gathers).
inline const float* fp8_e4m3_table() {
  static const struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = fp8_e4m3_decode(static_cast<uint8_t>(i));
    }
  } table;
  return table.v;
}

inline float fp8_e4m3_to_fp32(uint8_t b) { return fp8_e4m3_table()[b]; }

inline uint8_t fp32_to_fp8_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  u &= 0x7FFFFFFF;
  if (u > 0x7F800000) return sign | 0x7F;  // NaN
  if (u >= 0x43E80000) return sign | 0x7E;  // ≥ 464 (448 and the half-step above it): saturate
  if (u < 0x3C800000) {                     // below 2^-6: subnormal steps of 2^-9 (8 steps = 0x08, the smallest normal)
    float a;
    std::memcpy(&a, &u, 4);
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // exact scaling; round half to even
  }
  uint32_t r = ((u >> 23) - 120) << 3 | ((u >> 20) & 7);  // exponent rebiased (127 → 7), 3 mantissa bits
  const uint32_t rest = u & 0xFFFFF;
  if (rest > 0x80000 || (rest == 0x80000 && (r & 1))) ++r;  // to nearest even; a carry moves the exponent
  return sign | static_cast<uint8_t>(r > 0x7E ? 0x7E : r);
}

}  // namespace helios::kernels
