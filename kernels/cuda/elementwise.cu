// Embedding gather, SwiGLU, residual add, bias add: one thread per value, grid-stride loops.
#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void embedding_kernel(const int32_t* tokens, const float* table, int32_t dim, float* out) {
  const float* row = table + static_cast<int64_t>(tokens[blockIdx.x]) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = row[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

// The bias v on every row: one launch for the whole batch, not one per token.
__global__ void add_rows_kernel(float* rows, const float* v, int64_t n, int32_t dim) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    rows[i] += v[i % dim];
  }
}

}  // namespace

int launch_embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                     float* out, void* stream) {
  if (n_tokens <= 0) return 0;
  embedding_kernel<<<n_tokens, kThreads, 0, cuda::as_stream(stream)>>>(tokens, table, dim, out);
  return cuda::launch_status();
}

int launch_swiglu(const float* gate, const float* up, int64_t n, float* out, void* stream) {
  if (n <= 0) return 0;
  swiglu_kernel<<<blocks_for(n), kThreads, 0, cuda::as_stream(stream)>>>(gate, up, n, out);
  return cuda::launch_status();
}

int launch_add(float* x, const float* y, int64_t n, void* stream) {
  if (n <= 0) return 0;
  add_kernel<<<blocks_for(n), kThreads, 0, cuda::as_stream(stream)>>>(x, y, n);
  return cuda::launch_status();
}

int launch_add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim, void* stream) {
  if (n_rows <= 0 || dim <= 0) return 0;
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  add_rows_kernel<<<blocks_for(n), kThreads, 0, cuda::as_stream(stream)>>>(rows, v, n, dim);
  return cuda::launch_status();
}

}  // namespace helios::kernels
