// Shared by the GPU parity tests: device detection, device buffers, seeded inputs.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace helios::gpu_test {

// These tests also run on the host emulation of CUDA (tests/cuda_host, label cuda-host), where every
// GPU thread is a fiber: milliseconds on a GPU can be minutes there. A test may leave its costliest
// cases to the GPU when this is true, saying which.
#ifdef HELIOS_CUDA_HOST_EMULATION
inline constexpr bool kHostEmulation = true;
#else
inline constexpr bool kHostEmulation = false;
#endif

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define HELIOS_REQUIRE_GPU()                                                            \
  do {                                                                                  \
    if (!::helios::gpu_test::have_gpu()) {                                              \
      GTEST_SKIP() << "no CUDA device on this machine: GPU parity tests skipped";       \
    }                                                                                   \
  } while (0)

// Device memory holding a copy of a host vector; freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> normal_floats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// |got − want| ≤ rel·|want| + abs for every element; reports the first that is not.
inline ::testing::AssertionResult all_near(const std::vector<float>& got, const std::vector<float>& want,
                                           float rel, float abs) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs)) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (tolerance " << rel << " relative + " << abs << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace helios::gpu_test
