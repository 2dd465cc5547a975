// KV blocks between device and host for swap: one asynchronous copy per block on the stream
// (cudaMemcpyDefault: unified addressing tells the direction). With pinned host memory the copies
// overlap compute on other streams; with pageable memory they still work, staged by the driver.
#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {

int launch_gather_blocks(const float* src, const int32_t* host_ids, int32_t n,
                         int64_t floats_per_block, float* dst, void* stream) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(floats_per_block);
  for (int32_t i = 0; i < n; ++i) {
    const cudaError_t e = cudaMemcpyAsync(dst + i * floats_per_block, src + host_ids[i] * floats_per_block,
                                          bytes, cudaMemcpyDefault, cuda::as_stream(stream));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

int launch_scatter_blocks(const float* src, const int32_t* host_ids, int32_t n,
                          int64_t floats_per_block, float* dst, void* stream) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(floats_per_block);
  for (int32_t i = 0; i < n; ++i) {
    const cudaError_t e = cudaMemcpyAsync(dst + host_ids[i] * floats_per_block, src + i * floats_per_block,
                                          bytes, cudaMemcpyDefault, cuda::as_stream(stream));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace helios::kernels
