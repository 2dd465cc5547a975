// K-quant matmul layouts side by side: llama.cpp's row kernels (one weight row against 8
// activation rows, GGUF's block layout) and the CPU backend's interleaved ones (4 weight rows
// interleaved in 8-byte chunks: kernels/ref/quant_matmul_x4.cpp), for Q4_K and Q6_K. The two sum
// in different orders, so both are checked against the exact value (double, from the blocks'
// integers), not bit for bit.
//   build and run: bench/kernels/run_kquant_layout_bench.sh (single thread; shapes of Qwen2.5-Coder-1.5B)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_kernels.h"

using namespace helios::kernels;
using namespace helios::kernels::quant;

namespace {

void fill(BlockQ4_K& b, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  b.d = fp32_to_fp16(0.01f + 0.001f * (byte(rng) % 7));
  b.dmin = fp32_to_fp16(0.005f + 0.001f * (byte(rng) % 5));
  for (auto& s : b.scales) s = static_cast<uint8_t>(byte(rng));
  for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng));
}

void fill(BlockQ6_K& b, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  b.d = fp32_to_fp16(0.001f + 0.0001f * (byte(rng) % 7));
  for (auto& q : b.ql) q = static_cast<uint8_t>(byte(rng));
  for (auto& q : b.qh) q = static_cast<uint8_t>(byte(rng));
  for (auto& s : b.scales) s = static_cast<int8_t>(byte(rng));
}

// One super-block's dot product from its integers, in double.
double exact(const BlockQ4_K& w, const BlockQ8_K& x) {
  double sum = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    k_quant_scale_min(j, w.scales, &sc, &mn);
    long long qsum = 0, xsum = 0;
    for (int l = 0; l < 32; ++l) {
      qsum += static_cast<long long>((w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) * x.qs[32 * j + l];
      xsum += x.qs[32 * j + l];
    }
    sum += static_cast<double>(x.d) * (static_cast<double>(fp16_to_fp32(w.d)) * sc * qsum -
                                       static_cast<double>(fp16_to_fp32(w.dmin)) * mn * xsum);
  }
  return sum;
}

double exact(const BlockQ6_K& w, const BlockQ8_K& x) {
  long long isum = 0;
  for (int n = 0; n < kQKK; ++n) {  // n = 128h + 32i + l
    const int h = n / 128, i = n % 128 / 32, l = n % 32;
    const int q = ((w.ql[64 * h + 32 * (i % 2) + l] >> (4 * (i / 2))) & 0xF) | (((w.qh[32 * h + l] >> (2 * i)) & 3) << 4);
    isum += static_cast<long long>(w.scales[n / 16]) * (q - 32) * x.qs[n];
  }
  return static_cast<double>(x.d) * fp16_to_fp32(w.d) * static_cast<double>(isum);
}

template <typename Block>
void run(uint32_t type, const char* name, int K, int n_out, int n_rows) {
  const int nb = K / kQKK;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 1);
  std::vector<Block> w(static_cast<size_t>(n_out) * nb);
  for (auto& b : w) fill(b, rng);
  std::vector<float> xf(static_cast<size_t>(n_rows) * K);
  for (auto& v : xf) v = normal(rng);
  std::vector<BlockQ8_K> xq(static_cast<size_t>(n_rows) * nb);
  quantize_q8_k(xf.data(), xq.data(), n_rows * nb, true);
  std::vector<Block> w4(w.size());
  ref_interleave_weights(type, w.data(), n_out, K, w4.data());
  auto rows = [&](float* y) { matmul_k_quant(type, true, w.data(), xq.data(), nb, n_rows, n_out, 0, n_out, y); };
  auto interleaved = [&](float* y) { ref_matmul_interleaved(type, w4.data(), xq.data(), n_rows, K, n_out, 0, n_out, y); };
  std::vector<float> y_cur(static_cast<size_t>(n_rows) * n_out), y_new(y_cur.size());
  rows(y_cur.data());
  interleaved(y_new.data());
  double err_cur = 0, err_new = 0;  // both against the exact value, over the first 4 rows
  for (int r = 0; r < std::min(n_rows, 4); ++r)
    for (int o = 0; o < n_out; ++o) {
      double e = 0;
      for (int b = 0; b < nb; ++b) e += exact(w[static_cast<size_t>(o) * nb + b], xq[static_cast<size_t>(r) * nb + b]);
      const size_t i = static_cast<size_t>(r) * n_out + o;
      const double scale = std::max(1.0, std::fabs(e));
      err_cur = std::max(err_cur, std::fabs(y_cur[i] - e) / scale);
      err_new = std::max(err_new, std::fabs(y_new[i] - e) / scale);
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
    t_cur = std::min(t_cur, time([&] { rows(y_cur.data()); }));
    t_new = std::min(t_new, time([&] { interleaved(y_new.data()); }));
  }
  const double macs = static_cast<double>(n_rows) * n_out * K;
  std::printf("| %s | %d x %d | %d | %.3f | %.1f | %.3f | %.1f | **%.2fx** | %.1e | %.1e |\n", name, n_out, K, n_rows,
              t_cur * 1e3, macs / t_cur * 1e-9, t_new * 1e3, macs / t_new * 1e-9, t_cur / t_new, err_cur, err_new);
}

}  // namespace

int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 1536, n_out = argc > 2 ? atoi(argv[2]) : 8960,
            n_rows = argc > 3 ? atoi(argv[3]) : 64;
  const std::string type = argc > 4 ? argv[4] : "q4_k";
  if (K % kQKK != 0 || n_out % 4 != 0 || n_rows < 1 || (type != "q4_k" && type != "q6_k")) {
    std::fprintf(stderr, "usage: kquant_layout_bench IN OUT ROWS [q4_k|q6_k] (IN a multiple of 256, OUT of 4)\n");
    return 2;
  }
  if (type == "q6_k") run<BlockQ6_K>(kWeightQ6_K, "Q6_K", K, n_out, n_rows);
  else run<BlockQ4_K>(kWeightQ4_K, "Q4_K", K, n_out, n_rows);
}
