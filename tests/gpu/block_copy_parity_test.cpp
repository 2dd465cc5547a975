// KV block gather to (pinned) host memory and scatter back: the bytes of ref_gather_blocks and
// ref_scatter_blocks, exactly.
#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::DeviceArray;
using gpu_test::normal_floats;

TEST(GpuParity, BlockGatherAndScatterMatchTheCpuTwins) {
  HELIOS_REQUIRE_GPU();
  const int32_t n_blocks = 20;
  const int64_t per_block = 16 * 4 * 64;
  const auto cache = normal_floats(n_blocks * per_block, 21);
  const std::vector<int32_t> ids = {7, 0, 19, 3};
  const int32_t n = static_cast<int32_t>(ids.size());
  std::vector<float> want(n * per_block);
  kernels::ref_gather_blocks(cache.data(), ids.data(), n, per_block, want.data());

  DeviceArray<float> d_cache(cache);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), want.size() * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(kernels::launch_gather_blocks(d_cache.get(), ids.data(), n, per_block, pinned, stream), 0);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(std::vector<float>(pinned, pinned + want.size()), want);

  // Scatter into a zeroed cache at other ids.
  const std::vector<int32_t> dst_ids = {1, 2, 18, 10};
  std::vector<float> want_cache(cache.size(), 0.0f);
  kernels::ref_scatter_blocks(pinned, dst_ids.data(), n, per_block, want_cache.data());
  DeviceArray<float> d_dst(std::vector<float>(cache.size(), 0.0f));
  ASSERT_EQ(kernels::launch_scatter_blocks(pinned, dst_ids.data(), n, per_block, d_dst.get(), stream), 0);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(d_dst.to_host(), want_cache);
  cudaStreamDestroy(stream);
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace helios
