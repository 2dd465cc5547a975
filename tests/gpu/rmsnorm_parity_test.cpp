// launch_rmsnorm (CUDA) against ref_rmsnorm (CPU) on the same seeded inputs.
// Tolerance: 1e-5 relative — both reduce in double; only the order of the float products and the
// final rounding differ.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace helios {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(GpuParity, RmsNormMatchesTheCpuTwin) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU parity tests skipped";
  for (int32_t dim : {64, 576, 4096, 5000}) {
    const int32_t n_rows = 7;
    std::mt19937 rng(dim);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> x(n_rows * dim), w(dim), expected(x.size()), got(x.size());
    for (auto& v : x) v = normal(rng);
    for (auto& v : w) v = normal(rng);
    kernels::ref_rmsnorm(x.data(), w.data(), n_rows, dim, 1e-5f, expected.data());

    float *dx, *dw, *dout;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(kernels::launch_rmsnorm(dx, dw, n_rows, dim, 1e-5f, dout, nullptr), 0);
    ASSERT_EQ(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dout);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], expected[i], 1e-5f * std::fabs(expected[i]) + 1e-6f) << "dim " << dim << " i " << i;
    }
  }
}

}  // namespace
}  // namespace helios
