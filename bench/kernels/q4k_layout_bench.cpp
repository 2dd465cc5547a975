// Q4_K matmul layouts side by side: llama.cpp's row kernel (one weight row against 8 activation
// rows, GGUF's block layout) and the CPU backend's interleaved one (4 weight rows interleaved in
// 8-byte chunks: kernels/ref/quant_matmul_x4.cpp). The two sum in different orders, so both are
// checked against the exact value (double, from the blocks' integers), not bit for bit.
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
  std::vector<BlockQ4_K> w4(w.size());
  ref_interleave_weights(kWeightQ4_K, w.data(), n_out, K, w4.data());
  auto interleaved = [&](float* y) { ref_matmul_interleaved(kWeightQ4_K, w4.data(), xq.data(), n_rows, K, n_out, 0, n_out, y); };
  std::vector<float> y_cur(static_cast<size_t>(n_rows) * n_out), y_new(y_cur.size());
  matmul_k_quant(kWeightQ4_K, true, w.data(), xq.data(), nb, n_rows, n_out, 0, n_out, y_cur.data());
  interleaved(y_new.data());
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
  double t_cur = 1e9, t_new = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    t_cur = std::min(t_cur, time([&] { matmul_k_quant(kWeightQ4_K, true, w.data(), xq.data(), nb, n_rows, n_out, 0, n_out, y_cur.data()); }));
    t_new = std::min(t_new, time([&] { interleaved(y_new.data()); }));
  }
  const double macs = static_cast<double>(n_rows) * n_out * K;
  std::printf("| %d x %d | %d | %.3f | %.1f | %.3f | %.1f | **%.2fx** | %.1e | %.1e |\n", n_out, K, n_rows,
              t_cur * 1e3, macs / t_cur * 1e-9, t_new * 1e3, macs / t_new * 1e-9, t_cur / t_new, err_cur, err_new);
}
