// Q4_K matmul layouts side by side: the CPU backend's kernel (one weight row against 8 activation
// rows, GGUF's block layout) and a candidate layout for it, 4 weight rows interleaved in 8-byte
// chunks per 32-value sub-block, so that one 8-byte activation broadcast feeds a multiply for 4
// weight rows and a sub-block's four maddubs are summed in 16-bit lanes (at most 4 x 2 x 15 x 127
// = 15,240) before one madd with the 4 rows' scales: 1.25 multiplies per 32 products instead of 2.
// The candidate sums in another order, so it is checked against the exact value (double, from the
// blocks' integers) beside the current kernel, not bit for bit.
//   build and run: bench/kernels/run_q4k_layout_bench.sh (single thread; shapes of Qwen2.5-Coder-1.5B)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_kernels.h"

using namespace helios::kernels;
using namespace helios::kernels::quant;

// 4 weight rows' super-block b: their scales, mins and nibbles, chunk by chunk. 640 bytes against
// GGUF's 4 x 144: d, dmin, scales and mins are kept unpacked here (a layout for the backend would
// keep them as GGUF packs them, and so read no more bytes than today).
struct BlockQ4_Kx4 {
  float d[4], dmin[4];
  uint8_t sc[8][4];    // [sub-block][row]
  int16_t mins[4][8];  // [row][sub-block]
  uint8_t qs[4][4][4][8];  // [pair][chunk][row][8 bytes]: low nibble sub-block 2p, high 2p+1
};

void repack(const BlockQ4_K* rows[4], int nb, BlockQ4_Kx4* out) {
  for (int b = 0; b < nb; ++b) {
    BlockQ4_Kx4& o = out[b];
    for (int k = 0; k < 4; ++k) {
      const BlockQ4_K& w = rows[k][b];
      o.d[k] = fp16_to_fp32(w.d);
      o.dmin[k] = fp16_to_fp32(w.dmin);
      for (int j = 0; j < 8; ++j) {
        uint8_t s, m;
        k_quant_scale_min(j, w.scales, &s, &m);
        o.sc[j][k] = s;
        o.mins[k][j] = m;
      }
      for (int p = 0; p < 4; ++p)
        for (int c = 0; c < 4; ++c) std::memcpy(o.qs[p][c][k], w.qs + 32 * p + 8 * c, 8);
    }
  }
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 4 weight rows against R activation rows: out[r * 4 + k].
template <int R>
void tile_x4(const BlockQ4_Kx4* w, const BlockQ8_K* const* x, int nb, float* out /* [R][4] */) {
  __m256 acc[R], accm[R];
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0xF);
  // int16 lanes 4k..4k+3 <- row k's byte: pshufb pattern over a 4-byte scale word (both halves)
  const __m128i spread = _mm_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1);
  const __m128i spread_hi = _mm_setr_epi8(2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
  for (int b = 0; b < nb; ++b) {
    const BlockQ4_Kx4& wb = w[b];
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const int p = j / 2;
      __m256i q[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i bits = load256(wb.qs[p][c]);
        q[c] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bits, 4) : bits, m4);
      }
      int32_t sw;
      std::memcpy(&sw, wb.sc[j], 4);
      const __m128i s4 = _mm_cvtsi32_si128(sw);
      const __m256i scale = _mm256_set_m128i(_mm_shuffle_epi8(s4, spread_hi), _mm_shuffle_epi8(s4, spread));
      for (int r = 0; r < R; ++r) {
        const int8_t* xs = x[r][b].qs + 32 * j;
        __m256i s16 = _mm256_maddubs_epi16(q[0], _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(xs)));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[1], _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(xs + 8))));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[2], _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(xs + 16))));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[3], _mm256_set1_epi64x(*reinterpret_cast<const int64_t*>(xs + 24))));
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s16, scale));
        asm("" : "+x"(sumi[r]));
      }
    }
    const __m256 dw = _mm256_setr_ps(wb.d[0], wb.d[0], wb.d[1], wb.d[1], wb.d[2], wb.d[2], wb.d[3], wb.d[3]);
    const __m256 dm = _mm256_setr_ps(wb.dmin[0], wb.dmin[0], wb.dmin[2], wb.dmin[2], wb.dmin[1], wb.dmin[1],
                                     wb.dmin[3], wb.dmin[3]);
    const __m256i mins01 = load256(wb.mins[0]), mins23 = load256(wb.mins[2]);
    for (int r = 0; r < R; ++r) {
      const BlockQ8_K& xb = x[r][b];
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(xb.d), dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
      const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8)));
      const __m256i bs2 = _mm256_set_m128i(bs, bs);
      // [r0, r0, r2, r2 | r1, r1, r3, r3]
      const __m256i m = _mm256_hadd_epi32(_mm256_madd_epi16(mins01, bs2), _mm256_madd_epi16(mins23, bs2));
      accm[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(-xb.d), dm), _mm256_cvtepi32_ps(m), accm[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float a[8], m[8];
    _mm256_storeu_ps(a, acc[r]);
    _mm256_storeu_ps(m, accm[r]);
    out[r * 4 + 0] = (a[0] + a[1]) + (m[0] + m[1]);
    out[r * 4 + 1] = (a[2] + a[3]) + (m[4] + m[5]);
    out[r * 4 + 2] = (a[4] + a[5]) + (m[2] + m[3]);
    out[r * 4 + 3] = (a[6] + a[7]) + (m[6] + m[7]);
  }
}

template <int R>
void matmul_x4(const BlockQ4_Kx4* w, const BlockQ8_K* x, int nb, int n_rows, int n_out, float* y) {
  const int32_t chunk = row_chunk(static_cast<int64_t>(nb) * sizeof(BlockQ8_K), R);
  for (int r0 = 0; r0 < n_rows; r0 += chunk) {
    const int r1 = std::min(n_rows, r0 + chunk);
    for (int o = 0; o < n_out; o += 4) {
      int r = r0;
      for (; r + R <= r1; r += R) {
        const BlockQ8_K* xs[R];
        for (int i = 0; i < R; ++i) xs[i] = x + static_cast<int64_t>(r + i) * nb;
        float v[R * 4];
        tile_x4<R>(w + static_cast<int64_t>(o / 4) * nb, xs, nb, v);
        for (int i = 0; i < R; ++i)
          for (int k = 0; k < 4; ++k) y[static_cast<int64_t>(r + i) * n_out + o + k] = v[i * 4 + k];
      }
      for (; r < r1; ++r) {
        const BlockQ8_K* xs[1] = {x + static_cast<int64_t>(r) * nb};
        float v[4];
        tile_x4<1>(w + static_cast<int64_t>(o / 4) * nb, xs, nb, v);
        for (int k = 0; k < 4; ++k) y[static_cast<int64_t>(r) * n_out + o + k] = v[k];
      }
    }
  }
}

int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 1536, n_out = argc > 2 ? atoi(argv[2]) : 8960,
            n_rows = argc > 3 ? atoi(argv[3]) : 64;
  if (K % kQKK != 0 || n_out % 4 != 0 || n_rows < 1) {
    std::fprintf(stderr, "usage: q4k_layout_bench IN OUT ROWS (IN a multiple of 256, OUT of 4)\n");
    return 2;
  }
  const int nb = K / kQKK;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0, 1);
  std::vector<BlockQ4_K> w(static_cast<size_t>(n_out) * nb);
  for (auto& b : w) {
    b.d = fp32_to_fp16(0.01f + 0.001f * (byte(rng) % 7));
    b.dmin = fp32_to_fp16(0.005f + 0.001f * (byte(rng) % 5));
    for (auto& s : b.scales) s = static_cast<uint8_t>(byte(rng));
    for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng));
  }
  std::vector<float> xf(static_cast<size_t>(n_rows) * K);
  for (auto& v : xf) v = normal(rng);
  std::vector<BlockQ8_K> xq(static_cast<size_t>(n_rows) * nb);
  quantize_q8_k(xf.data(), xq.data(), n_rows * nb, true);
  std::vector<BlockQ4_Kx4> w4(static_cast<size_t>(n_out / 4) * nb);
  for (int o = 0; o < n_out; o += 4) {
    const BlockQ4_K* rows[4];
    for (int k = 0; k < 4; ++k) rows[k] = w.data() + static_cast<size_t>(o + k) * nb;
    repack(rows, nb, w4.data() + static_cast<size_t>(o / 4) * nb);
  }
  std::vector<float> y_cur(static_cast<size_t>(n_rows) * n_out), y_new(y_cur.size());
  matmul_k_quant(kWeightQ4_K, true, w.data(), xq.data(), nb, n_rows, n_out, 0, n_out, y_cur.data());
  matmul_x4<4>(w4.data(), xq.data(), nb, n_rows, n_out, y_new.data());
  double err_cur = 0, err_new = 0;
  {  // both against the exact value (double, from the blocks' integers)
    double e_cur = 0, e_new = 0;
    for (int r = 0; r < std::min(n_rows, 4); ++r)
      for (int o = 0; o < n_out; ++o) {
        double exact = 0;
        for (int b = 0; b < nb; ++b) {
          const BlockQ4_K& wb = w[static_cast<size_t>(o) * nb + b];
          const BlockQ8_K& xb = xq[static_cast<size_t>(r) * nb + b];
          for (int j = 0; j < 8; ++j) {
            uint8_t sc, mn;
            k_quant_scale_min(j, wb.scales, &sc, &mn);
            long long qsum = 0, xsum = 0;
            for (int l = 0; l < 32; ++l) {
              const int q = (wb.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
              qsum += static_cast<long long>(q) * xb.qs[32 * j + l];
              xsum += xb.qs[32 * j + l];
            }
            exact += static_cast<double>(xb.d) * (static_cast<double>(fp16_to_fp32(wb.d)) * sc * qsum -
                                                  static_cast<double>(fp16_to_fp32(wb.dmin)) * mn * xsum);
          }
        }
        const size_t i = static_cast<size_t>(r) * n_out + o;
        const double scale = std::max(1.0, std::fabs(exact));
        e_cur = std::max(e_cur, std::fabs(y_cur[i] - exact) / scale);
        e_new = std::max(e_new, std::fabs(y_new[i] - exact) / scale);
      }
    err_cur = e_cur, err_new = e_new;
  }
  auto time = [&](auto&& f) {
    double best = 1e9;
    for (int it = 0; it < 7; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  // Best of 7 per layout; the layouts alternate so that a busy machine slows them alike.
  double t_cur = 1e9, t4 = 1e9, t6 = 1e9, t8 = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    t_cur = std::min(t_cur, time([&] { matmul_k_quant(kWeightQ4_K, true, w.data(), xq.data(), nb, n_rows, n_out, 0, n_out, y_cur.data()); }));
    t4 = std::min(t4, time([&] { matmul_x4<4>(w4.data(), xq.data(), nb, n_rows, n_out, y_new.data()); }));
    t6 = std::min(t6, time([&] { matmul_x4<6>(w4.data(), xq.data(), nb, n_rows, n_out, y_new.data()); }));
    t8 = std::min(t8, time([&] { matmul_x4<8>(w4.data(), xq.data(), nb, n_rows, n_out, y_new.data()); }));
  }
  const double macs = static_cast<double>(n_rows) * n_out * K;
  const double best = std::min(t4, std::min(t6, t8));
  std::printf("| %d x %d | %d | %.3f | %.1f | %.3f / %.3f / %.3f | **%.2fx** | %.1e | %.1e |\n", n_out, K, n_rows,
              t_cur * 1e3, macs / t_cur * 1e-9, t4 * 1e3, t6 * 1e3, t8 * 1e3, t_cur / best, err_cur, err_new);
}
