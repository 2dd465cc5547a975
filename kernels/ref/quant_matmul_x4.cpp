// K-quant weights with 4 rows interleaved, against Q8_K activations. GGUF's layout puts a row's
// super-blocks one after another, so a kernel multiplies one weight row at a time and needs two
// multiplies (maddubs, then madd with the sub-block's scale) per 32 products. Interleaved, one
// 8-byte activation broadcast meets 8 bytes of each of 4 rows in one maddubs, and the 4 rows'
// products are summed in 16-bit lanes before they meet the 4 rows' scales in one madd: for Q4_K
// a 32-value sub-block's four maddubs (at most 4·2·15·127 = 15,240), 1.25 multiplies per 32
// products; for Q6_K each 16-value group's two (at most 2·2·63·127 = 32,004), 1.5. An
// interleaved block holds the 4 rows' GGUF bytes rearranged, so the weights take no more memory.
//
// The integer sums are exact in any order; the float order differs from llama.cpp's row kernels
// (quant_matmul_k.cpp): per row, two int32 lanes (the first and second halves of every 8-byte
// chunk; Q4_K also keeps two min lanes, sub-blocks 0-3 and 4-7) accumulate with one fused
// multiply-add per super-block and are added at the end. The scalar twins follow the same
// order, so the vector code gives their bits.
#include <cstring>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_kernels.h"

namespace helios::kernels {
namespace quant {
namespace {

// 4 weight rows' super-block b (rows 4g..4g+3 of the matrix): their d and dmin, their 12 packed
// scale bytes as three 32-bit words each (word i of row k at scales[i][k], so that one 128-bit
// load holds word i of all 4 rows), and their nibbles in 8-byte chunks: qs[p][c][k] is row k's
// qs[32p + 8c .. 32p + 8c + 8] (values 8c..8c+7 of sub-blocks 2p, low nibbles, and 2p+1, high).
struct BlockQ4_Kx4 {
  uint16_t d[4];
  uint16_t dmin[4];
  uint32_t scales[3][4];
  uint8_t qs[4][4][4][8];
};
static_assert(sizeof(BlockQ4_Kx4) == 4 * sizeof(BlockQ4_K), "the same bytes, rearranged");

void pack(const BlockQ4_K* const rows[4], BlockQ4_Kx4& o) {
  for (int k = 0; k < 4; ++k) {
    const BlockQ4_K& s = *rows[k];
    o.d[k] = s.d;
    o.dmin[k] = s.dmin;
    for (int i = 0; i < 3; ++i) std::memcpy(&o.scales[i][k], s.scales + 4 * i, 4);
    for (int p = 0; p < 4; ++p)
      for (int c = 0; c < 4; ++c) std::memcpy(o.qs[p][c][k], s.qs + 32 * p + 8 * c, 8);
  }
}

void unpack(const BlockQ4_Kx4& s, int k, BlockQ4_K& o) {
  o.d = s.d[k];
  o.dmin = s.dmin[k];
  for (int i = 0; i < 3; ++i) std::memcpy(o.scales + 4 * i, &s.scales[i][k], 4);
  for (int p = 0; p < 4; ++p)
    for (int c = 0; c < 4; ++c) std::memcpy(o.qs + 32 * p + 8 * c, s.qs[p][c][k], 8);
}

// 4 rows' Q6_K super-block: group g of 32 values (g = 4h + i, values 32g..32g+31) takes its low
// 4 bits from ql[64h + 32(i % 2) + l] (low nibbles for i < 2, high for i ≥ 2) and its top 2 from
// bits 2i of qh[32h + l]; here in 8-byte chunks c of l, row k innermost. The scales stay per row.
struct BlockQ6_Kx4 {
  uint8_t ql[2][2][4][4][8];  // [h][i % 2][c][k]
  uint8_t qh[2][4][4][8];     // [h][c][k]
  int8_t scales[4][16];       // [k]: row k's 16 scales
  uint16_t d[4];
};
static_assert(sizeof(BlockQ6_Kx4) == 4 * sizeof(BlockQ6_K), "the same bytes, rearranged");

void pack(const BlockQ6_K* const rows[4], BlockQ6_Kx4& o) {
  for (int k = 0; k < 4; ++k) {
    const BlockQ6_K& s = *rows[k];
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 4; ++c) {
        for (int i2 = 0; i2 < 2; ++i2) std::memcpy(o.ql[h][i2][c][k], s.ql + 64 * h + 32 * i2 + 8 * c, 8);
        std::memcpy(o.qh[h][c][k], s.qh + 32 * h + 8 * c, 8);
      }
    std::memcpy(o.scales[k], s.scales, 16);
    o.d[k] = s.d;
  }
}

void unpack(const BlockQ6_Kx4& s, int k, BlockQ6_K& o) {
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 4; ++c) {
      for (int i2 = 0; i2 < 2; ++i2) std::memcpy(o.ql + 64 * h + 32 * i2 + 8 * c, s.ql[h][i2][c][k], 8);
      std::memcpy(o.qh + 32 * h + 8 * c, s.qh[h][c][k], 8);
    }
  std::memcpy(o.scales, s.scales[k], 16);
  o.d = s.d[k];
}

// Rows 4g..4g+3 of a [n_out, nb super-blocks] matrix into group g's nb interleaved blocks.
template <typename Row, typename X4>
void interleave(const Row* w, int32_t n_out, int nb, X4* out) {
  for (int32_t g = 0; g < n_out / 4; ++g) {
    for (int b = 0; b < nb; ++b) {
      const Row* rows[4];
      for (int k = 0; k < 4; ++k) rows[k] = w + static_cast<int64_t>(4 * g + k) * nb + b;
      pack(rows, out[static_cast<int64_t>(g) * nb + b]);
    }
  }
}

template <typename Row, typename X4>
void deinterleave_row(const X4* w, int nb, int32_t row, Row* out) {
  for (int b = 0; b < nb; ++b) unpack(w[static_cast<int64_t>(row / 4) * nb + b], row % 4, out[b]);
}

// --- Scalar twins: one activation row against the 4 weight rows, out[k] for row k.
void dot_q4_k_x4(const BlockQ4_Kx4* w, const BlockQ8_K* x, int nb, float out[4]) {
  float acc[4][2] = {}, acc_m[4][2] = {};
  for (int b = 0; b < nb; ++b) {
    const BlockQ4_Kx4& wb = w[b];
    const BlockQ8_K& xb = x[b];
    for (int k = 0; k < 4; ++k) {
      uint8_t packed[12], sc[8], mn[8];
      for (int i = 0; i < 3; ++i) std::memcpy(packed + 4 * i, &wb.scales[i][k], 4);
      for (int j = 0; j < 8; ++j) k_quant_scale_min(j, packed, &sc[j], &mn[j]);
      int32_t lanes[2] = {}, mins[2] = {};
      for (int j = 0; j < 8; ++j) {
        for (int c = 0; c < 4; ++c) {
          const uint8_t* q = wb.qs[j / 2][c][k];
          const int8_t* a = xb.qs + 32 * j + 8 * c;
          for (int i = 0; i < 8; ++i) lanes[i / 4] += sc[j] * ((q[i] >> (4 * (j % 2))) & 0xF) * a[i];
        }
        mins[j / 4] += mn[j] * (xb.bsums[2 * j] + xb.bsums[2 * j + 1]);
      }
      const float d = xb.d * fp16_to_fp32(wb.d[k]), dmin = -xb.d * fp16_to_fp32(wb.dmin[k]);
      for (int h = 0; h < 2; ++h) {
        acc[k][h] = std::fma(d, static_cast<float>(lanes[h]), acc[k][h]);
        acc_m[k][h] = std::fma(dmin, static_cast<float>(mins[h]), acc_m[k][h]);
      }
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = (acc[k][0] + acc[k][1]) + (acc_m[k][0] + acc_m[k][1]);
}

struct TileQ4KScalar {
  template <int R>
  void operator()(const BlockQ4_Kx4* w, const BlockQ8_K* const* x, int nb, float* out) const {
    for (int r = 0; r < R; ++r) dot_q4_k_x4(w, x[r], nb, out + 4 * r);
  }
};

// Q6_K: lane h of row k takes the products at chunk positions 4h..4h+3, each times its group's
// scale, less 32·Σ scale·bsum over groups of 16 0-7 (h = 0) or 8-15 (h = 1): the offset −32.
void dot_q6_k_x4(const BlockQ6_Kx4* w, const BlockQ8_K* x, int nb, float out[4]) {
  float acc[4][2] = {};
  for (int b = 0; b < nb; ++b) {
    const BlockQ6_Kx4& wb = w[b];
    const BlockQ8_K& xb = x[b];
    for (int k = 0; k < 4; ++k) {
      int32_t lanes[2] = {};
      for (int g = 0; g < 8; ++g) {
        const int h = g / 4, i = g % 4;
        for (int c = 0; c < 4; ++c) {
          const uint8_t* ql = wb.ql[h][i % 2][c][k];
          const uint8_t* qh = wb.qh[h][c][k];
          const int8_t* a = xb.qs + 32 * g + 8 * c;
          const int scale = wb.scales[k][2 * g + c / 2];
          for (int l = 0; l < 8; ++l) {
            const int q = ((ql[l] >> (4 * (i / 2))) & 0xF) | (((qh[l] >> (2 * i)) & 3) << 4);
            lanes[l / 4] += scale * q * a[l];
          }
        }
      }
      for (int t = 0; t < 16; ++t) lanes[t / 8] -= 32 * wb.scales[k][t] * xb.bsums[t];
      const float d = xb.d * fp16_to_fp32(wb.d[k]);
      for (int h = 0; h < 2; ++h) acc[k][h] = std::fma(d, static_cast<float>(lanes[h]), acc[k][h]);
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = acc[k][0] + acc[k][1];
}

struct TileQ6KScalar {
  template <int R>
  void operator()(const BlockQ6_Kx4* w, const BlockQ8_K* const* x, int nb, float* out) const {
    for (int r = 0; r < R; ++r) dot_q6_k_x4(w, x[r], nb, out + 4 * r);
  }
};

#if HELIOS_QUANT_AVX2
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 4 weight rows against R activation rows: out[4r + k]. Lanes of a row-major __m256i of
// int16 or int32 follow the interleaved bytes: rows 0-3 in quarters.
// A Q4_K group's scales and minimums of one super-block: k_quant_scale_min for the 4 rows at
// once, a row per 32-bit lane; sc's bytes are [row 0's 8 scales, row 1's | row 2's, row 3's].
struct Q4KScales {
  __m256i sc;
  __m128i mn_lo, mn_hi;
};
inline Q4KScales q4k_scales(const BlockQ4_Kx4& wb) {
  const __m128i low6 = _mm_set1_epi8(0x3f), low4 = _mm_set1_epi8(0xF), low2 = _mm_set1_epi8(3);
  const __m128i u0 = load128(wb.scales[0]), u1 = load128(wb.scales[1]), u2 = load128(wb.scales[2]);
  const __m128i sc_lo = _mm_and_si128(u0, low6), mn_lo = _mm_and_si128(u1, low6);
  const __m128i sc_hi = _mm_or_si128(_mm_and_si128(u2, low4), _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u0, 6), low2), 4));
  const __m128i mn_hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(u2, 4), low4),
                                     _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u1, 6), low2), 4));
  return {_mm256_set_m128i(_mm_unpackhi_epi32(sc_lo, sc_hi), _mm_unpacklo_epi32(sc_lo, sc_hi)), mn_lo, mn_hi};
}
// 32-value sums of the sub-blocks (bs2: an activation block's, in both halves), then Σ mn·sum
// per row over sub-blocks 0-3 and 4-7: [r0, r0, r2, r2 | r1, r1, r3, r3]
inline __m256i q4k_min_sums(const Q4KScales& s, __m256i bs2) {
  const __m256i mins01 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi32(s.mn_lo, s.mn_hi));
  const __m256i mins23 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi32(s.mn_lo, s.mn_hi));
  return _mm256_hadd_epi32(_mm256_madd_epi16(mins01, bs2), _mm256_madd_epi16(mins23, bs2));
}
inline __m256i q4k_block_sums(const BlockQ8_K& xb) {
  const __m128i bs = _mm_hadd_epi16(load128(xb.bsums), load128(xb.bsums + 8));
  return _mm256_set_m128i(bs, bs);
}
// A group's d (per int32 lane pair) and dmin (in q4k_min_sums' order).
inline __m256 q4k_d(const BlockQ4_Kx4& wb, __m256* dmin) {
  const __m256 dd = _mm256_cvtph_ps(load128(wb.d));  // [d0..d3, dmin0..dmin3]
  *dmin = _mm256_permutevar8x32_ps(dd, _mm256_setr_epi32(4, 4, 6, 6, 5, 5, 7, 7));
  return _mm256_permutevar8x32_ps(dd, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}
// A row's 4 results from its lanes a and its min lanes m (8 floats each).
inline void q4k_results(const float* a, const float* m, float* out) {
  out[0] = (a[0] + a[1]) + (m[0] + m[1]);
  out[1] = (a[2] + a[3]) + (m[4] + m[5]);
  out[2] = (a[4] + a[5]) + (m[2] + m[3]);
  out[3] = (a[6] + a[7]) + (m[6] + m[7]);
}

struct TileQ4KAvx2 {
  template <int R>
  void operator()(const BlockQ4_Kx4* w, const BlockQ8_K* const* x, int nb, float* out) const {
    __m256 acc[R], acc_m[R];
    for (int r = 0; r < R; ++r) acc[r] = acc_m[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF);
    // pshufb picking scale j of rows (0, 1) in the low half, (2, 3) in the high: int16 lanes 4k..4k+3
    const __m256i pick0 = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 8, -1, 8, -1, 8, -1, 8, -1,
                                           0, -1, 0, -1, 0, -1, 0, -1, 8, -1, 8, -1, 8, -1, 8, -1);
    for (int b = 0; b < nb; ++b) {
      const BlockQ4_Kx4& wb = w[b];
      const Q4KScales s = q4k_scales(wb);
      const __m256i sc = s.sc;
      __m256i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256i q[4];
        for (int c = 0; c < 4; ++c) {
          const __m256i bits = load256(wb.qs[j / 2][c]);
          q[c] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bits, 4) : bits, m4);
        }
        const __m256i scale = _mm256_shuffle_epi8(sc, _mm256_add_epi8(pick0, _mm256_set1_epi16(static_cast<int16_t>(j))));
        for (int r = 0; r < R; ++r) {
          const int8_t* a = x[r][b].qs + 32 * j;
          __m256i s16 = _mm256_maddubs_epi16(q[0], broadcast8_avx2(a));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[1], broadcast8_avx2(a + 8)));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[2], broadcast8_avx2(a + 16)));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[3], broadcast8_avx2(a + 24)));
          sumi[r] = madd_add_avx2(sumi[r], s16, scale);
          asm("" : "+x"(sumi[r]));  // keep each row's sum in its register (see quant_matmul_k.cpp)
        }
      }
      __m256 dm;
      const __m256 dw = q4k_d(wb, &dm);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(xb.d), dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        const __m256i m = q4k_min_sums(s, q4k_block_sums(xb));
        acc_m[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(-xb.d), dm), _mm256_cvtepi32_ps(m), acc_m[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float a[8], m[8];
      _mm256_storeu_ps(a, acc[r]);
      _mm256_storeu_ps(m, acc_m[r]);
      q4k_results(a, m, out + 4 * r);
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HELIOS_QUANT_X4_AVX512 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own warnings call
// uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline __m512i pair256(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(load256(lo)), load256(hi), 1);
}
inline __m512i broadcast8_avx512(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm512_set1_epi64(v);
}
// Two 256-bit halves as one register.
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1); }
inline __m512 join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_zextps256_ps512(lo), hi, 1); }
inline __m512i madd_add_avx512(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// Two groups of 4 rows (8 weight rows) in one 512-bit register, group a in the low half and b
// in the high: each half runs TileQ4KAvx2's integers and float chain for its group, lane for
// lane, so the results are its bits at half the instructions per product. out[8r + k]: rows 0-3
// are group a's, 4-7 group b's.
struct TileQ4KAvx512 {
  template <int R>
  void operator()(const BlockQ4_Kx4* wa, const BlockQ4_Kx4* wb, const BlockQ8_K* const* x, int nb, float* out) const {
    __m512 acc[R], acc_m[R];
    for (int r = 0; r < R; ++r) acc[r] = acc_m[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i pick0 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 8, -1, 8, -1, 8, -1, 8, -1));
    for (int b = 0; b < nb; ++b) {
      const BlockQ4_Kx4 &ba = wa[b], &bb = wb[b];
      const Q4KScales sa = q4k_scales(ba), sb = q4k_scales(bb);
      const __m512i sc = join(sa.sc, sb.sc);
      __m512i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512i q[4];
        for (int c = 0; c < 4; ++c) {
          const __m512i bits = pair256(ba.qs[j / 2][c], bb.qs[j / 2][c]);
          q[c] = _mm512_and_si512(j % 2 ? _mm512_srli_epi16(bits, 4) : bits, m4);
        }
        const __m512i scale = _mm512_shuffle_epi8(sc, _mm512_add_epi8(pick0, _mm512_set1_epi16(static_cast<int16_t>(j))));
        for (int r = 0; r < R; ++r) {
          const int8_t* a = x[r][b].qs + 32 * j;
          __m512i s16 = _mm512_maddubs_epi16(q[0], broadcast8_avx512(a));
          s16 = _mm512_add_epi16(s16, _mm512_maddubs_epi16(q[1], broadcast8_avx512(a + 8)));
          s16 = _mm512_add_epi16(s16, _mm512_maddubs_epi16(q[2], broadcast8_avx512(a + 16)));
          s16 = _mm512_add_epi16(s16, _mm512_maddubs_epi16(q[3], broadcast8_avx512(a + 24)));
          sumi[r] = madd_add_avx512(sumi[r], s16, scale);
          asm("" : "+v"(sumi[r]));  // keep each row's sum in its register
        }
      }
      __m256 dma, dmb;
      const __m256 dwa = q4k_d(ba, &dma), dwb = q4k_d(bb, &dmb);
      const __m512 dw = join(dwa, dwb), dm = join(dma, dmb);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(xb.d), dw), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
        const __m256i bs2 = q4k_block_sums(xb);
        const __m512i m = join(q4k_min_sums(sa, bs2), q4k_min_sums(sb, bs2));
        acc_m[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-xb.d), dm), _mm512_cvtepi32_ps(m), acc_m[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(64) float a[16], m[16];
      _mm512_store_ps(a, acc[r]);
      _mm512_store_ps(m, acc_m[r]);
      q4k_results(a, m, out + 8 * r);
      q4k_results(a + 8, m + 8, out + 8 * r + 4);
    }
  }
};
#pragma GCC diagnostic pop
#endif

// A Q6_K group's scales of one super-block: transposed to [group of 16][row] (t[q] holds groups
// 4q..4q+3, 4 bytes each), and per row as int16 (sc[k]: row k's 16).
struct Q6KScales {
  __m128i t[4];
  __m256i sc[4];
};
inline Q6KScales q6k_scales(const BlockQ6_Kx4& wb) {
  const __m128i s0 = load128(wb.scales[0]), s1 = load128(wb.scales[1]), s2 = load128(wb.scales[2]),
                s3 = load128(wb.scales[3]);
  const __m128i lo01 = _mm_unpacklo_epi8(s0, s1), lo23 = _mm_unpacklo_epi8(s2, s3);
  const __m128i hi01 = _mm_unpackhi_epi8(s0, s1), hi23 = _mm_unpackhi_epi8(s2, s3);
  return {{_mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23), _mm_unpacklo_epi16(hi01, hi23),
           _mm_unpackhi_epi16(hi01, hi23)},
          {_mm256_cvtepi8_epi16(s0), _mm256_cvtepi8_epi16(s1), _mm256_cvtepi8_epi16(s2), _mm256_cvtepi8_epi16(s3)}};
}
// Group of 16 number n's scale of row k in int16 lanes 4k..4k+3.
inline __m256i q6k_spread(const Q6KScales& s, int n) {
  const int8_t f = static_cast<int8_t>(4 * (n % 4));
  const __m128i pick = _mm_setr_epi8(f, f, f, f, f + 1, f + 1, f + 1, f + 1, f + 2, f + 2, f + 2, f + 2, f + 3,
                                     f + 3, f + 3, f + 3);
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s.t[n / 4], pick));
}
// Σ scale·bsum per row over groups 0-7 (low half) and 8-15 (high), to [r0, r0, r1, r1, ...]
inline __m256i q6k_offsets(const Q6KScales& s, __m256i bsums) {
  const __m256i h01 = _mm256_hadd_epi32(_mm256_madd_epi16(s.sc[0], bsums), _mm256_madd_epi16(s.sc[1], bsums));
  const __m256i h23 = _mm256_hadd_epi32(_mm256_madd_epi16(s.sc[2], bsums), _mm256_madd_epi16(s.sc[3], bsums));
  return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h01, h23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
// A group's d per int32 lane pair.
inline __m256 q6k_d(const BlockQ6_Kx4& wb) {
  return _mm256_permutevar8x32_ps(
      _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb.d)))),
      _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

struct TileQ6KAvx2 {
  template <int R>
  void operator()(const BlockQ6_Kx4* w, const BlockQ8_K* const* x, int nb, float* out) const {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int b = 0; b < nb; ++b) {
      const BlockQ6_Kx4& wb = w[b];
      const Q6KScales s = q6k_scales(wb);
      __m256i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const int h = g / 4, i = g % 4;
        __m256i q[4];
        for (int c = 0; c < 4; ++c) {
          const __m256i low = load256(wb.ql[h][i % 2][c]);
          const __m256i top = _mm256_and_si256(_mm256_srli_epi16(load256(wb.qh[h][c]), 2 * i), m3);
          q[c] = _mm256_or_si256(_mm256_and_si256(i < 2 ? low : _mm256_srli_epi16(low, 4), m4), _mm256_slli_epi16(top, 4));
        }
        const __m256i scale_a = q6k_spread(s, 2 * g), scale_b = q6k_spread(s, 2 * g + 1);
        for (int r = 0; r < R; ++r) {
          const int8_t* a = x[r][b].qs + 32 * g;
          const __m256i sa = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], broadcast8_avx2(a)),
                                              _mm256_maddubs_epi16(q[1], broadcast8_avx2(a + 8)));
          const __m256i sb = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], broadcast8_avx2(a + 16)),
                                              _mm256_maddubs_epi16(q[3], broadcast8_avx2(a + 24)));
          sumi[r] = madd_add_avx2(madd_add_avx2(sumi[r], sa, scale_a), sb, scale_b);
          asm("" : "+x"(sumi[r]));
        }
      }
      const __m256 dw = q6k_d(wb);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        const __m256i lanes = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(q6k_offsets(s, load256(xb.bsums)), 5));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(xb.d), dw), _mm256_cvtepi32_ps(lanes), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float a[8];
      _mm256_storeu_ps(a, acc[r]);
      for (int k = 0; k < 4; ++k) out[4 * r + k] = a[2 * k] + a[2 * k + 1];
    }
  }
};
#endif

#if HELIOS_QUANT_X4_AVX512
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// TileQ6KAvx2 for two groups of 4 rows at once, group a in the low half of each register and b
// in the high, as TileQ4KAvx512: the same bits. out[8r + k]: rows 0-3 group a's, 4-7 b's.
struct TileQ6KAvx512 {
  template <int R>
  void operator()(const BlockQ6_Kx4* wa, const BlockQ6_Kx4* wb, const BlockQ8_K* const* x, int nb, float* out) const {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3);
    for (int b = 0; b < nb; ++b) {
      const BlockQ6_Kx4 &ba = wa[b], &bb = wb[b];
      const Q6KScales sa = q6k_scales(ba), sb = q6k_scales(bb);
      __m512i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const int h = g / 4, i = g % 4;
        __m512i q[4];
        for (int c = 0; c < 4; ++c) {
          const __m512i low = pair256(ba.ql[h][i % 2][c], bb.ql[h][i % 2][c]);
          const __m512i top = _mm512_and_si512(_mm512_srli_epi16(pair256(ba.qh[h][c], bb.qh[h][c]), 2 * i), m3);
          q[c] = _mm512_or_si512(_mm512_and_si512(i < 2 ? low : _mm512_srli_epi16(low, 4), m4), _mm512_slli_epi16(top, 4));
        }
        const __m512i scale_a = join(q6k_spread(sa, 2 * g), q6k_spread(sb, 2 * g));
        const __m512i scale_b = join(q6k_spread(sa, 2 * g + 1), q6k_spread(sb, 2 * g + 1));
        for (int r = 0; r < R; ++r) {
          const int8_t* a = x[r][b].qs + 32 * g;
          const __m512i s_a = _mm512_add_epi16(_mm512_maddubs_epi16(q[0], broadcast8_avx512(a)),
                                               _mm512_maddubs_epi16(q[1], broadcast8_avx512(a + 8)));
          const __m512i s_b = _mm512_add_epi16(_mm512_maddubs_epi16(q[2], broadcast8_avx512(a + 16)),
                                               _mm512_maddubs_epi16(q[3], broadcast8_avx512(a + 24)));
          sumi[r] = madd_add_avx512(madd_add_avx512(sumi[r], s_a, scale_a), s_b, scale_b);
          asm("" : "+v"(sumi[r]));
        }
      }
      const __m512 dw = join(q6k_d(ba), q6k_d(bb));
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        const __m256i bs = load256(xb.bsums);
        const __m512i lanes = _mm512_sub_epi32(sumi[r], _mm512_slli_epi32(join(q6k_offsets(sa, bs), q6k_offsets(sb, bs)), 5));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(xb.d), dw), _mm512_cvtepi32_ps(lanes), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(64) float a[16];
      _mm512_store_ps(a, acc[r]);
      for (int k = 0; k < 8; ++k) out[8 * r + k] = a[2 * k] + a[2 * k + 1];
    }
  }
};
#pragma GCC diagnostic pop
#endif

// Groups of 4 weight rows [out_begin, out_end) against the activation rows, in chunks that stay in
// L2 while the weights pass over them, R activation rows per tile and the rows left over in one
// tile of their own count; with a Pair8 tile, two groups to a tile wherever two remain (NoPair: a
// group at a time).
struct NoPair {};
template <typename X4, int R, typename Tile, typename Pair8 = NoPair>
void matmul_x4(const Tile& tile, const void* w, const void* xq, int nb, int32_t n_rows, int32_t n_out,
               int32_t out_begin, int32_t out_end, float* y, const Pair8& pair = {}) {
  constexpr bool kPairs = !std::is_same_v<Pair8, NoPair>;
  const auto* wb = static_cast<const X4*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(xq);
  const int32_t chunk = row_chunk(static_cast<int64_t>(nb) * sizeof(BlockQ8_K), R);
  for (int32_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int32_t r1 = n_rows - r0 < chunk ? n_rows : r0 + chunk;
    for (int32_t o = out_begin; o < out_end;) {
      const X4* wg = wb + static_cast<int64_t>(o / 4) * nb;
      const bool two = kPairs && o + 8 <= out_end;
      steps_exact<R>(r0, r1, [&]<int RT>(int32_t r) {
        const BlockQ8_K* xs[RT];
        for (int i = 0; i < RT; ++i) xs[i] = xb + static_cast<int64_t>(r + i) * nb;
        if constexpr (kPairs) {
          if (two) {
            float v[RT * 8];
            pair.template operator()<RT>(wg, wg + nb, xs, nb, v);
            store_tile<8, RT>(v, o, r, n_out, y);
            return;
          }
        }
        float v[RT * 4];
        tile.template operator()<RT>(wg, xs, nb, v);
        store_tile<4, RT>(v, o, r, n_out, y);
      });
      o += two ? 8 : 4;
    }
  }
}

#if HELIOS_QUANT_X4_AVX512
// Activation rows per paired tile: 4 rows' sums and accumulators beside the unpacked weights; 8
// spill (measured, 32 rows of Q4_K 8960 x 1536: 152 GMAC/s with 4, 89 with 8; Q6_K 1536 x 8960:
// 106-122 with 4, 92-94 with 2).
constexpr int kPairTileRows = 4;
#endif

void matmul_interleaved(uint32_t type, bool vector, const void* w, const void* xq, int32_t n_rows, int32_t n_in,
                        int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const int nb = n_in / kQKK;
  const bool q6 = type == kWeightQ6_K;
#if HELIOS_QUANT_AVX2
  if (vector) {
#if HELIOS_QUANT_X4_AVX512
    if (q6 && n_rows >= kPairedMinRows)
      return matmul_x4<BlockQ6_Kx4, kPairTileRows>(TileQ6KAvx2{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y,
                                                   TileQ6KAvx512{});
#endif
    if (q6) return matmul_x4<BlockQ6_Kx4, kSumRowsPerTile>(TileQ6KAvx2{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
#if HELIOS_QUANT_X4_AVX512
    if (n_rows >= kPairedMinRows)
      return matmul_x4<BlockQ4_Kx4, kPairTileRows>(TileQ4KAvx2{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y,
                                                   TileQ4KAvx512{});
#endif
    return matmul_x4<BlockQ4_Kx4, kSumRowsPerTile>(TileQ4KAvx2{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
  }
#endif
  (void)vector;
  if (q6) return matmul_x4<BlockQ6_Kx4, 1>(TileQ6KScalar{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
  matmul_x4<BlockQ4_Kx4, 1>(TileQ4KScalar{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
}

}  // namespace
}  // namespace quant

bool ref_interleavable(uint32_t weight_type, int32_t n_out, int32_t n_in) {
  return (weight_type == kWeightQ4_K || weight_type == kWeightQ6_K) && n_out % kInterleavedRows == 0 &&
         n_in % kQKK == 0;
}

bool ref_interleaved_pays(uint32_t weight_type) {
  if (weight_type == kWeightQ4_K) return true;
  return weight_type == kWeightQ6_K && quant::kSumRowsPerTile >= 8;
}

void ref_interleave_weights(uint32_t weight_type, const void* w, int32_t n_out, int32_t n_in, void* out) {
  const int nb = n_in / kQKK;
  if (weight_type == kWeightQ6_K) {
    quant::interleave(static_cast<const BlockQ6_K*>(w), n_out, nb, static_cast<quant::BlockQ6_Kx4*>(out));
  } else {
    quant::interleave(static_cast<const BlockQ4_K*>(w), n_out, nb, static_cast<quant::BlockQ4_Kx4*>(out));
  }
}

void ref_deinterleave_row(uint32_t weight_type, const void* w, int32_t n_in, int32_t row, void* out) {
  const int nb = n_in / kQKK;
  if (weight_type == kWeightQ6_K) {
    quant::deinterleave_row(static_cast<const quant::BlockQ6_Kx4*>(w), nb, row, static_cast<BlockQ6_K*>(out));
  } else {
    quant::deinterleave_row(static_cast<const quant::BlockQ4_Kx4*>(w), nb, row, static_cast<BlockQ4_K*>(out));
  }
}

void ref_matmul_interleaved(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows, int32_t n_in,
                            int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  quant::matmul_interleaved(weight_type, true, w, xq, n_rows, n_in, n_out, out_begin, out_end, y);
}

void ref_matmul_interleaved_scalar(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                                   int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  quant::matmul_interleaved(weight_type, false, w, xq, n_rows, n_in, n_out, out_begin, out_end, y);
}

}  // namespace helios::kernels
