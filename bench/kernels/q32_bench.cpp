// The 32-value quantized matmuls (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) of one build, single thread, on
// random blocks: ms and GMAC/s per shape and batch, each result checked bit for bit against the
// scalar reference. run_q32_bench.sh builds it twice, with and without AVX-512, and prints the
// two side by side.
//   q32_bench TYPE IN OUT ROWS...     e.g. q32_bench q5_0 896 4864 1 8 32 64
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_blocks.h"

using namespace helios::kernels;

namespace {

struct Type {
  const char* name;
  uint32_t id;
  size_t block_bytes;
  bool has_min;
};
constexpr Type kTypes[] = {{"q8_0", kWeightQ8_0, sizeof(BlockQ8_0), false}, {"q4_0", kWeightQ4_0, sizeof(BlockQ4_0), false},
                           {"q4_1", kWeightQ4_1, sizeof(BlockQ4_1), true},  {"q5_0", kWeightQ5_0, sizeof(BlockQ5_0), false},
                           {"q5_1", kWeightQ5_1, sizeof(BlockQ5_1), true}};

}  // namespace

int main(int argc, char** argv) {
  const Type* type = nullptr;
  if (argc >= 5)
    for (const Type& t : kTypes) type = std::string(argv[1]) == t.name ? &t : type;
  const int n_in = argc >= 5 ? std::atoi(argv[2]) : 0, n_out = argc >= 5 ? std::atoi(argv[3]) : 0;
  if (type == nullptr || n_in <= 0 || n_in % 32 != 0 || n_out <= 0) {
    std::fprintf(stderr, "usage: q32_bench q8_0|q4_0|q4_1|q5_0|q5_1 IN OUT ROWS... (IN a multiple of 32)\n");
    return 2;
  }
  std::mt19937 rng(1);
  // Random bytes, then sane scales (and minimums) in each block's fp16 fields.
  std::vector<uint8_t> w(type->block_bytes * n_out * (n_in / 32));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < w.size(); i += type->block_bytes) {
    const uint16_t d = fp32_to_fp16(0.01f + 0.001f * static_cast<float>(rng() % 7));
    std::memcpy(&w[i], &d, 2);
    if (type->has_min) {
      const uint16_t m = fp32_to_fp16(-0.05f);
      std::memcpy(&w[i + 2], &m, 2);
    }
  }
  std::normal_distribution<float> normal(0, 1);
  for (int a = 4; a < argc; ++a) {
    const int n_rows = std::atoi(argv[a]);
    std::vector<float> x(static_cast<size_t>(n_rows) * n_in);
    for (auto& v : x) v = normal(rng);
    std::vector<uint8_t> xq(ref_activation_row_bytes(type->id, n_in) * n_rows);
    ref_quantize_activations(type->id, x.data(), n_rows, n_in, xq.data());
    std::vector<float> y(static_cast<size_t>(n_rows) * n_out), ref(y.size());
    ref_matmul_quantized_scalar(type->id, w.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, ref.data());
    double best = 1e9;
    for (int it = 0; it < 21; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      ref_matmul_quantized(type->id, w.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, y.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    size_t differ = 0;
    for (size_t i = 0; i < y.size(); ++i) differ += std::memcmp(&y[i], &ref[i], 4) != 0;
    std::printf("%s %d %d %d %.4f %.1f %zu\n", type->name, n_out, n_in, n_rows, best * 1e3,
                static_cast<double>(n_rows) * n_out * n_in / best * 1e-9, differ);
  }
}
