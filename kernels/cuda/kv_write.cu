// KV write: each token's K and V rows into its cache slot, as f32, f16 or fp8 (E4M3). One block per token.
#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

template <typename T>
__global__ void kv_write_kernel(const float* k, const float* v, const int32_t* slots, int64_t row, T* cache_k,
                                T* cache_v) {
  cuda::inputs_ready();
  const int64_t src = static_cast<int64_t>(blockIdx.x) * row;
  const int64_t dst = static_cast<int64_t>(slots[blockIdx.x]) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    cuda::store_kv(cache_k + dst + i, k[src + i]);
    cuda::store_kv(cache_v + dst + i, v[src + i]);
  }
}

}  // namespace

int launch_kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                    const PagedKV& cache, void* stream) {
  if (n_tokens <= 0) return 0;
  const int64_t row = static_cast<int64_t>(cache.n_kv_heads) * cache.head_dim;
  const cudaStream_t s = cuda::as_stream(stream);
  return cuda::with_kv_elements(cache, [&](auto* cache_k, auto* cache_v) {
    return cuda::launch_chained("kv_write_kernel", kv_write_kernel<std::remove_pointer_t<decltype(cache_k)>>, n_tokens,
                                128, 0, s, k, v, slots, row, cache_k, cache_v);
  });
}

}  // namespace helios::kernels
