// Tensor types: the type table, fp16/bf16 conversion (checked against independent reference
// formulas), quantize→dequantize error bounds derived from each block format, hand-built blocks
// with known values, and the refusals of dequantize_row/quantize_row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "helios/tensor_type.h"

namespace helios {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Type table

TEST(TensorTypeTable, BlockLayoutsMatchGgml) {
  struct Want { TensorType type; const char* name; int64_t elems, bytes; bool dequant; };
  const Want want[] = {
      {TensorType::kF32, "F32", 1, 4, true},      {TensorType::kF16, "F16", 1, 2, true},
      {TensorType::kQ4_0, "Q4_0", 32, 18, true},  {TensorType::kQ4_1, "Q4_1", 32, 20, true},
      {TensorType::kQ5_0, "Q5_0", 32, 22, true},  {TensorType::kQ5_1, "Q5_1", 32, 24, true},
      {TensorType::kQ8_0, "Q8_0", 32, 34, true},  {TensorType::kQ8_1, "Q8_1", 32, 36, false},
      {TensorType::kQ2_K, "Q2_K", 256, 84, false}, {TensorType::kQ3_K, "Q3_K", 256, 110, false},
      {TensorType::kQ4_K, "Q4_K", 256, 144, true}, {TensorType::kQ5_K, "Q5_K", 256, 176, true},
      {TensorType::kQ6_K, "Q6_K", 256, 210, true}, {TensorType::kQ8_K, "Q8_K", 256, 292, false},
      {TensorType::kBF16, "BF16", 1, 2, true},    {TensorType::kI32, "I32", 1, 4, false},
  };
  for (const Want& w : want) {
    SCOPED_TRACE(w.name);
    auto t = tensor_type_traits(static_cast<uint32_t>(w.type));
    ASSERT_TRUE(t.has_value());
    EXPECT_STREQ(t->name, w.name);
    EXPECT_EQ(t->block_elems, w.elems);
    EXPECT_EQ(t->block_bytes, w.bytes);
    EXPECT_EQ(t->can_dequantize, w.dequant);
    EXPECT_STREQ(tensor_type_name(w.type), w.name);
  }
}

TEST(TensorTypeTable, UndefinedIdsHaveNoTraits) {
  for (uint32_t id : {4u, 5u, 16u, 23u, 29u, 31u, 1000u, 0xFFFFFFFFu}) {
    EXPECT_FALSE(tensor_type_traits(id).has_value()) << id;
  }
  EXPECT_STREQ(tensor_type_name(static_cast<TensorType>(99)), "unknown");
}

TEST(TensorTypeTable, RowBytes) {
  EXPECT_EQ(tensor_row_bytes(TensorType::kF32, 576), 2304);
  EXPECT_EQ(tensor_row_bytes(TensorType::kQ8_0, 576), 18 * 34);
  EXPECT_EQ(tensor_row_bytes(TensorType::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(tensor_row_bytes(TensorType::kQ4_K, 512), 288);
  EXPECT_EQ(tensor_row_bytes(TensorType::kQ6_K, 256), 210);
}

TEST(TensorTypeFromName, IsCaseInsensitiveAndRoundTrips) {
  EXPECT_EQ(tensor_type_from_name("q4_1"), TensorType::kQ4_1);
  EXPECT_EQ(tensor_type_from_name("F16"), TensorType::kF16);
  EXPECT_EQ(tensor_type_from_name("bf16"), TensorType::kBF16);
  EXPECT_EQ(tensor_type_from_name("q4_k"), TensorType::kQ4_K);
  EXPECT_EQ(tensor_type_from_name("Q6_K"), TensorType::kQ6_K);
  EXPECT_EQ(tensor_type_from_name("q8_0"), TensorType::kQ8_0);
  for (uint32_t id = 0; id < 64; ++id) {
    if (auto t = tensor_type_traits(id)) {
      EXPECT_EQ(tensor_type_from_name(t->name), static_cast<TensorType>(id)) << t->name;
    }
  }
}

TEST(TensorTypeFromName, RejectsUnknownNames) {
  for (const char* name : {"", "q4", "Q4_", "q4_1 ", " f16", "float16", "unknown", "Q4_2"}) {
    EXPECT_FALSE(tensor_type_from_name(name).has_value()) << "'" << name << "'";
  }
}

// ---------------------------------------------------------------------------------------------
// fp16

// IEEE binary16 by formula: value = mant·2^-24 (subnormal) or (1024+mant)·2^(exp-25).
double half_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Round-to-nearest-even by search over the positive halves; 0x7C00 stands for 2^16, the value
// IEEE rounding compares against before it overflows to infinity.
uint16_t ref_fp32_to_fp16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  auto val = [](uint16_t h) { return h == 0x7C00 ? 65536.0 : half_value(h); };
  uint16_t lo = 0, hi = 0x7C00;  // val(lo) <= a < val(hi), or a >= 65536
  if (a >= 65536.0) return sign | 0x7C00;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (val(mid) <= a ? lo : hi) = mid;
  }
  const double dlo = a - val(lo), dhi = val(hi) - a;
  const bool up = dhi < dlo || (dhi == dlo && (lo & 1));
  return sign | (up ? hi : lo);
}

TEST(TensorTypeFp16, ToFp32MatchesTheFormulaForEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const int exp = (h >> 10) & 0x1F;
    if (exp == 31) {
      EXPECT_EQ(std::isnan(f), (h & 0x3FF) != 0) << std::hex << h;
      EXPECT_EQ(std::isinf(f), (h & 0x3FF) == 0) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(static_cast<uint16_t>(h))) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // keeps -0
  }
}

TEST(TensorTypeFp16, EveryHalfSurvivesARoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t back = fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h)));
    const bool nan = ((h >> 10) & 0x1F) == 31 && (h & 0x3FF);
    if (nan) {
      EXPECT_TRUE((back & 0x7C00) == 0x7C00 && (back & 0x3FF)) << std::hex << h << " → " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000);
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(TensorTypeFp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);          // tie, 1.0 is even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);      // tie, rounds up to even
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just above the tie
  EXPECT_EQ(fp32_to_fp16(-2.0f - 0x1p-10f), 0xC000);        // tie below −2 → −2
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);                // largest half
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7BFF);              // below the overflow tie
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);                // tie with 2^16 → infinity
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xFC00);
}

TEST(TensorTypeFp16, Subnormals) {
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);                  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);                  // tie with 0 → 0 (even)
  EXPECT_EQ(fp32_to_fp16(0x1p-25f * 1.0001f), 0x0001);        // above the tie
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);              // tie between 1 and 2 → 2
  EXPECT_EQ(fp32_to_fp16(0x1p-26f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(fp32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);       // tie 0x3FF/0x400 → smallest normal
  EXPECT_EQ(fp32_to_fp16(0x1p-14f - 0x1p-24f), 0x03FF);       // largest subnormal
  EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x03FF), 1023 * 0x1p-24f);
}

TEST(TensorTypeFp16, InfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp32_to_fp16(inf), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-inf), 0xFC00);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7C00)));
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7F802000u}) {
    const uint16_t h = fp32_to_fp16(float_of(nan_bits));
    EXPECT_EQ(h & 0x7C00, 0x7C00) << std::hex << nan_bits;
    EXPECT_NE(h & 0x3FF, 0) << "NaN " << std::hex << nan_bits << " became infinity";
    EXPECT_TRUE(std::isnan(fp16_to_fp32(h)));
  }
}

TEST(TensorTypeFp16, MatchesReferenceRoundingOnRandomFloats) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int i = 0; i < 300000; ++i) {
    uint32_t b = rng();
    if (i % 2) b = (b & 0x807FFFFF) | ((100 + rng() % 45) << 23);  // exponents near fp16's range
    const float f = float_of(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), ref_fp32_to_fp16(f)) << std::hexfloat << f;
    ++checked;
  }
  EXPECT_GT(checked, 290000);
}

// ---------------------------------------------------------------------------------------------
// bf16

// Nearest-even by comparing the two bf16 neighbours in double; 0x7F80 stands for 2^128.
uint16_t ref_fp32_to_bf16(float f) {
  const uint32_t b = bits_of(f);
  const uint16_t lo = static_cast<uint16_t>(b >> 16);
  const uint16_t hi_mag = static_cast<uint16_t>((lo & 0x7FFF) + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(float_of(static_cast<uint32_t>(lo) << 16)));
  const double vhi = hi_mag == 0x7F80 ? std::ldexp(1.0, 128)
                                      : static_cast<double>(float_of(static_cast<uint32_t>(hi_mag) << 16));
  const bool up = vhi - a < a - vlo || (vhi - a == a - vlo && (lo & 1));
  return up ? static_cast<uint16_t>((lo & 0x8000) | hi_mag) : lo;
}

TEST(TensorTypeBf16, ToFp32IsExactForEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(bits_of(bf16_to_fp32(static_cast<uint16_t>(h))), h << 16);
  }
}

TEST(TensorTypeBf16, EveryValueSurvivesARoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(TensorTypeBf16, RoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);            // tie → even
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);        // tie → even (up)
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(0x1p-149f), 0x0000);                 // tiny subnormal → +0
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const uint16_t h = fp32_to_bf16(float_of(nan_bits));
    EXPECT_TRUE(std::isnan(bf16_to_fp32(h))) << std::hex << nan_bits << " → " << h;
    EXPECT_EQ(h & 0x8000, (nan_bits >> 16) & 0x8000);
  }
}

TEST(TensorTypeBf16, MatchesReferenceRoundingOnRandomFloats) {
  std::mt19937 rng(11);
  for (int i = 0; i < 300000; ++i) {
    const float f = float_of(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), ref_fp32_to_bf16(f)) << std::hexfloat << f;
  }
}

// ---------------------------------------------------------------------------------------------
// Quantize → dequantize

std::vector<uint8_t> quantize(TensorType type, const std::vector<float>& x) {
  std::vector<uint8_t> q(tensor_row_bytes(type, static_cast<int64_t>(x.size())));
  EXPECT_TRUE(quantize_row(type, x.data(), q.data(), static_cast<int64_t>(x.size())).ok());
  return q;
}

std::vector<float> round_trip(TensorType type, const std::vector<float>& x) {
  const std::vector<uint8_t> q = quantize(type, x);
  std::vector<float> y(x.size(), std::nanf(""));
  EXPECT_TRUE(dequantize_row(type, q.data(), y.data(), static_cast<int64_t>(y.size())).ok());
  return y;
}

// Test rows: several distributions, 8 super-blocks (2048 values) each.
std::vector<std::vector<float>> test_rows() {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> pos(0.5f, 2.0f);
  std::vector<std::vector<float>> rows(6, std::vector<float>(2048));
  for (size_t i = 0; i < 2048; ++i) {
    rows[0][i] = uni(rng);
    rows[1][i] = 3.0f * gauss(rng);
    rows[2][i] = pos(rng);                                   // all positive
    rows[3][i] = -pos(rng);                                  // all negative
    rows[4][i] = (i % 97 == 0 ? 50.0f : 0.01f) * uni(rng);   // outliers dominate
    rows[5][i] = 0.0f;                                       // zeros must stay zero
  }
  return rows;
}

// max |x| over [i, i+n)
float block_amax(const std::vector<float>& x, size_t i, size_t n) {
  float a = 0;
  for (size_t j = i; j < i + n; ++j) a = std::max(a, std::fabs(x[j]));
  return a;
}

constexpr double kHalfU = 0x1p-11;  // unit roundoff of an fp16 scale
constexpr double kSlop = 1e-5;      // fp32 arithmetic, relative to the block's amax

// Q8_0: d = amax/127 rounded to fp16; |x − fp16(d)·q| ≤ d/2 (rounding) + 127·d·u (scale rounding).
TEST(TensorTypeQuant, Q8_0ErrorBound) {
  for (const auto& x : test_rows()) {
    const auto y = round_trip(TensorType::kQ8_0, x);
    for (size_t b = 0; b < x.size(); b += 32) {
      const double amax = block_amax(x, b, 32);
      const double bound = amax / 254 + amax * kHalfU + amax * kSlop;
      for (size_t j = b; j < b + 32; ++j) ASSERT_LE(std::fabs(y[j] - x[j]), bound) << j;
    }
  }
}

// Q4_0 and Q5_0 (L = 8 or 16 levels each side): the signed value m of largest magnitude maps to
// −L, d = m/−L. An element with t = x/d ≤ L − 0.5 rounds to within d/2; one with t in (L − 0.5, L]
// (opposite sign to m) is clipped to L − 1 and may be off by up to |d| = amax/L. The fp16 scale
// adds ≤ L·|d|·u.
TEST(TensorTypeQuant, Q4_0AndQ5_0ErrorBound) {
  for (const auto& [type, levels] : {std::pair{TensorType::kQ4_0, 8}, std::pair{TensorType::kQ5_0, 16}}) {
    SCOPED_TRACE(tensor_type_name(type));
    for (const auto& x : test_rows()) {
      const auto y = round_trip(type, x);
      for (size_t b = 0; b < x.size(); b += 32) {
        const double amax = block_amax(x, b, 32);
        double m = 0;
        for (size_t j = b; j < b + 32; ++j) if (std::fabs(x[j]) == amax) { m = x[j]; break; }
        const double d = m / -levels;
        for (size_t j = b; j < b + 32; ++j) {
          const bool clipped = d != 0 && x[j] / d > levels - 0.5;
          const double step = clipped ? amax / levels : amax / (2 * levels);
          ASSERT_LE(std::fabs(y[j] - x[j]), step + amax * kHalfU + amax * kSlop) << j;
        }
      }
    }
  }
}

// Q4_1 and Q5_1 (S = 15 or 31 steps): range R = max − min, d = R/S, values min + d·q. Rounding
// gives ≤ R/(2S); the fp16 scale adds ≤ S·d·u = R·u and the fp16 minimum ≤ |min|·u.
TEST(TensorTypeQuant, Q4_1AndQ5_1ErrorBound) {
  for (const auto& [type, steps] : {std::pair{TensorType::kQ4_1, 15}, std::pair{TensorType::kQ5_1, 31}}) {
    SCOPED_TRACE(tensor_type_name(type));
    for (const auto& x : test_rows()) {
      const auto y = round_trip(type, x);
      for (size_t b = 0; b < x.size(); b += 32) {
        const auto [mn, mx] = std::minmax_element(x.begin() + b, x.begin() + b + 32);
        const double range = *mx - *mn, amax = block_amax(x, b, 32);
        const double bound = range / (2 * steps) + (range + std::fabs(*mn)) * kHalfU + amax * kSlop;
        for (size_t j = b; j < b + 32; ++j) ASSERT_LE(std::fabs(y[j] - x[j]), bound) << j;
      }
    }
  }
}

// Q5_0/Q5_1 blocks built by hand: the fifth bit of element j is bit j of qh.
TEST(TensorTypeDequant, HandBuiltQ5Blocks) {
  uint8_t q5_0[22], q5_1[24];
  const uint16_t one = 0x3C00, min_half = 0xB800;  // 1, −0.5
  const uint32_t high = 0xA5A5F00F;
  for (uint8_t* b : {q5_0, q5_1}) std::memcpy(b, &one, 2);
  std::memcpy(q5_1 + 2, &min_half, 2);
  for (int k = 0; k < 4; ++k) q5_0[2 + k] = q5_1[4 + k] = static_cast<uint8_t>(high >> (8 * k));
  for (int j = 0; j < 16; ++j) q5_0[6 + j] = q5_1[8 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y0[32], y1[32];
  ASSERT_TRUE(dequantize_row(TensorType::kQ5_0, q5_0, y0, 32).ok());
  ASSERT_TRUE(dequantize_row(TensorType::kQ5_1, q5_1, y1, 32).ok());
  for (int j = 0; j < 32; ++j) {
    const int q = (j < 16 ? j : 31 - j) | static_cast<int>((high >> j) & 1) << 4;
    EXPECT_EQ(y0[j], q - 16.0f) << j;
    EXPECT_EQ(y1[j], q - 0.5f) << j;
  }
}

// Q4_K (this quantizer): sub-block j of 32 gets scale s_j = (max_j + min'_j)/15 with
// min'_j = max(0, −min_j) ≤ amax, so s_j ≤ S ≤ 2·amax/15. Super-block scales d = S/63 and
// dmin = max min'/63 ≤ amax/63; 6-bit sub-scales round to within d/2 and dmin/2.
// Unclipped elements err ≤ (s_j + d/2)/2 ≤ amax/15 + d/4; clipped ones ≤ 7.5·d + dmin/2
// ≤ amax/42. So err ≤ amax/15 + amax/1890; we allow amax/15 + amax/945 for fp16 rounding.
// Q5_K: the same with 31 steps, s_j ≤ 2·amax/31: unclipped ≤ amax/31 + d/4 (d ≤ 2·amax/1953),
// clipped ≤ 15.5·d + dmin/2 ≤ amax/42.
TEST(TensorTypeQuant, Q4_KAndQ5_KErrorBound) {
  for (TensorType type : {TensorType::kQ4_K, TensorType::kQ5_K}) {
    SCOPED_TRACE(tensor_type_name(type));
    for (const auto& x : test_rows()) {
      const auto y = round_trip(type, x);
      for (size_t b = 0; b < x.size(); b += 256) {
        const double amax = block_amax(x, b, 256);
        const double rounding = type == TensorType::kQ4_K ? amax / 15 : std::max(amax / 31 + amax / 3906, amax / 42);
        const double bound = rounding + amax / 945 + amax * kSlop;
        for (size_t j = b; j < b + 256; ++j) ASSERT_LE(std::fabs(y[j] - x[j]), bound) << j;
      }
    }
  }
}

// Q6_K (this quantizer): group g of 16 gets scale s_g = amax_g/31 ≤ M = amax/31; d = M/127 and
// 8-bit sub-scales round to within d/2. Unclipped err ≤ (s_g + d/2)/2 ≤ amax/62 + d/4; a value
// clipped at +31 is off by ≤ 15.5·d < amax/62. So err ≤ amax/62·(1 + 1/254) (+ fp16 slack).
TEST(TensorTypeQuant, Q6_KErrorBound) {
  for (const auto& x : test_rows()) {
    const auto y = round_trip(TensorType::kQ6_K, x);
    for (size_t b = 0; b < x.size(); b += 256) {
      const double amax = block_amax(x, b, 256);
      const double bound = amax / 62 * (1 + 1.0 / 127) + amax * kSlop;
      for (size_t j = b; j < b + 256; ++j) ASSERT_LE(std::fabs(y[j] - x[j]), bound) << j;
    }
  }
}

// Within a K-quant super-block, a small-valued sub-block must keep its own (small) scale: its
// error must scale with its own range, not only the super-block's.
TEST(TensorTypeQuant, KQuantsKeepSmallSubBlocksAccurate) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = (i < 32 ? 1.0f : 0.125f) * std::sin(0.37f * i);
  for (TensorType type : {TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(tensor_type_name(type));
    const auto y = round_trip(type, x);
    double small_err = 0;
    for (int i = 32; i < 256; ++i) small_err = std::max(small_err, double(std::fabs(y[i] - x[i])));
    // Per-sub-block bounds with amax 0.125 (plus one super-block scale step, 1/63 of amax 1).
    const double bound = type == TensorType::kQ4_K   ? 0.125 / 15 + 1.0 / 63
                         : type == TensorType::kQ5_K ? 0.125 / 31 + 1.0 / 63
                                                     : 0.125 / 62 + 1.0 / 127;
    EXPECT_LE(small_err, bound);
  }
}

TEST(TensorTypeQuant, ZerosStayZeroAndRepresentableValuesAreExact) {
  for (TensorType type : {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                          TensorType::kQ5_1, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(tensor_type_name(type));
    const std::vector<float> zeros(256, 0.0f);
    for (float v : round_trip(type, zeros)) ASSERT_EQ(v, 0.0f);
  }
  std::vector<float> q8(32), q4_0(32), q4_1(32);
  for (int i = 0; i < 32; ++i) {
    q8[i] = 0.5f * static_cast<float>(i * 8 - 127);       // d = 0.5, q = 8i − 127 ∈ [−127, 121]
    q4_0[i] = 0.25f * static_cast<float>(i % 16 - 8);     // m = −2 → d = 0.25, q ∈ [0, 15]
    q4_1[i] = -1.0f + 0.125f * static_cast<float>(i % 16);  // min −1, d = 0.125
  }
  EXPECT_EQ(round_trip(TensorType::kQ8_0, q8), q8);
  EXPECT_EQ(round_trip(TensorType::kQ4_0, q4_0), q4_0);
  EXPECT_EQ(round_trip(TensorType::kQ4_1, q4_1), q4_1);
}

// Blocks built by hand, so the layout is checked independently of the quantizers.
TEST(TensorTypeDequant, HandBuiltBlocks) {
  uint8_t q8[34];
  const uint16_t half = 0x3800;  // 0.5
  std::memcpy(q8, &half, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  float y[32];
  ASSERT_TRUE(dequantize_row(TensorType::kQ8_0, q8, y, 32).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j * 8 - 128)) << j;

  uint8_t q4_0[18];
  const uint16_t one = 0x3C00;
  std::memcpy(q4_0, &one, 2);
  for (int j = 0; j < 16; ++j) q4_0[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ASSERT_TRUE(dequantize_row(TensorType::kQ4_0, q4_0, y, 32).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j - 8.0f) << j;             // low nibbles are elements 0..15
    EXPECT_EQ(y[j + 16], 7.0f - j) << j;        // high nibbles are elements 16..31
  }

  uint8_t q4_1[20];
  const uint16_t min_half = 0xB800;  // −0.5
  std::memcpy(q4_1, &half, 2);
  std::memcpy(q4_1 + 2, &min_half, 2);
  for (int j = 0; j < 16; ++j) q4_1[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ASSERT_TRUE(dequantize_row(TensorType::kQ4_1, q4_1, y, 32).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 0.5f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 0.5f) << j;
  }
}

TEST(TensorTypeQuant, PlainTypesAreIdentityOnRepresentableValues) {
  std::mt19937 rng(3);
  std::vector<float> f32(100), f16(100), bf16(100);
  for (int i = 0; i < 100; ++i) {
    f32[i] = float_of((rng() & 0x807FFFFF) | ((60 + rng() % 130) << 23));
    f16[i] = fp16_to_fp32(static_cast<uint16_t>(rng() % 0x7C00) | (i % 2 ? 0x8000 : 0));
    bf16[i] = bf16_to_fp32(static_cast<uint16_t>(rng() % 0x7F80));
  }
  EXPECT_EQ(round_trip(TensorType::kF32, f32), f32);
  EXPECT_EQ(round_trip(TensorType::kF16, f16), f16);
  EXPECT_EQ(round_trip(TensorType::kBF16, bf16), bf16);
  const std::vector<float> inexact = {1.0f + 0x1p-12f, 0.1f, 1e6f};
  const auto y16 = round_trip(TensorType::kF16, inexact);
  EXPECT_EQ(y16[0], 1.0f);
  EXPECT_EQ(y16[1], fp16_to_fp32(fp32_to_fp16(0.1f)));
  EXPECT_TRUE(std::isinf(y16[2]));
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(TensorTypeDequant, RefusesTypesItCannotDequantize) {
  const std::vector<uint8_t> src(4096, 0);
  std::vector<float> dst(256, 42.0f);
  for (TensorType type : {TensorType::kQ8_1, TensorType::kQ2_K,
                          TensorType::kQ3_K, TensorType::kQ8_K, TensorType::kI8,
                          TensorType::kI32, TensorType::kF64, static_cast<TensorType>(4),
                          static_cast<TensorType>(99)}) {
    const Status s = dequantize_row(type, src.data(), dst.data(), 256);
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << static_cast<int>(type);
    EXPECT_NE(s.message().find(tensor_type_name(type)), std::string::npos) << s.message();
  }
  for (float v : dst) ASSERT_EQ(v, 42.0f);  // nothing written
}

TEST(TensorTypeDequant, RefusesPartialBlocks) {
  const std::vector<uint8_t> src(4096, 0);
  std::vector<float> dst(512, 42.0f);
  const std::pair<TensorType, int64_t> cases[] = {
      {TensorType::kQ8_0, 33}, {TensorType::kQ4_0, 16}, {TensorType::kQ4_1, 31},
      {TensorType::kQ5_0, 48}, {TensorType::kQ5_1, 40}, {TensorType::kQ4_K, 255},
      {TensorType::kQ4_K, 32}, {TensorType::kQ5_K, 300}, {TensorType::kQ6_K, 257}};
  for (const auto& [type, n] : cases) {
    const Status s = dequantize_row(type, src.data(), dst.data(), n);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << tensor_type_name(type) << " n=" << n;
    EXPECT_NE(s.message().find(std::to_string(n)), std::string::npos) << s.message();
  }
  for (float v : dst) ASSERT_EQ(v, 42.0f);
}

TEST(TensorTypeQuant, QuantizeRefusesUnsupportedTypesAndPartialBlocks) {
  std::vector<float> src(256, 1.0f);
  std::vector<uint8_t> dst(4096, 0xAB);
  EXPECT_EQ(quantize_row(TensorType::kQ2_K, src.data(), dst.data(), 256).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(quantize_row(TensorType::kQ8_K, src.data(), dst.data(), 256).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(quantize_row(static_cast<TensorType>(99), src.data(), dst.data(), 256).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_row(TensorType::kQ8_0, src.data(), dst.data(), 48).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_row(TensorType::kQ6_K, src.data(), dst.data(), 128).code(), StatusCode::kInvalidArgument);
  for (uint8_t v : dst) ASSERT_EQ(v, 0xAB);
}

}  // namespace
}  // namespace helios
