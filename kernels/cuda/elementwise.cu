// Embedding gather, SwiGLU, residual add, bias add: one thread per value, grid-stride loops. SwiGLU
// rounded to 8 bits for the down projection as it is written: one thread per unit of 32 values
// (q8_rounding.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/q8_rounding.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void embedding_kernel(const int32_t* tokens, const float* table, int32_t dim, float* out) {
  cuda::inputs_ready();
  const float* row = table + static_cast<int64_t>(tokens[blockIdx.x]) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = row[i];
}

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  cuda::inputs_ready();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = silu_times(gate[i], up[i]);
  }
}

// Unit k of each row: silu(gate) * up written to out (which may be gate) and rounded into rows.
template <cuda::Act kAct>
__global__ void swiglu_q8_kernel(const float* gate, const float* up, int64_t n_units, float* out, cuda::Q8Rows rows) {
  cuda::inputs_ready();
  using cuda::kUnit;
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool active = u < n_units;  // every lane shuffles, with or without a unit
  float v[kUnit] = {};
  if (active) {
    for (int j = 0; j < kUnit; ++j) {
      v[j] = silu_times(gate[u * kUnit + j], up[u * kUnit + j]);
      out[u * kUnit + j] = v[j];
    }
  }
  const int32_t units_per_row = rows.n_in / kUnit;
  cuda::round_unit<kAct>(v, active, u / units_per_row, static_cast<int32_t>(u % units_per_row), rows);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  cuda::inputs_ready();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

// The bias v on every row: one launch for the whole batch, not one per token.
__global__ void add_rows_kernel(float* rows, const float* v, int64_t n, int32_t dim) {
  cuda::inputs_ready();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    rows[i] += v[i % dim];
  }
}

}  // namespace

int launch_embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                     float* out, void* stream) {
  if (n_tokens <= 0) return 0;
  return cuda::launch_chained("embedding_kernel", embedding_kernel, n_tokens, kThreads, 0, cuda::as_stream(stream), tokens,
                              table, dim, out);
}

int launch_swiglu(const float* gate, const float* up, int64_t n, float* out, void* stream) {
  if (n <= 0) return 0;
  return cuda::launch_chained("swiglu_kernel", swiglu_kernel, blocks_for(n), kThreads, 0, cuda::as_stream(stream), gate,
                              up, n, out);
}

int launch_swiglu_q8(uint32_t weight_type, const float* gate, const float* up, int32_t n_rows, int32_t n_ff,
                     float* out, void* workspace, size_t workspace_bytes, void* stream) {
  if (n_rows <= 0) return 0;
  if (!cuda::q8_args_ok(weight_type, n_rows, n_ff, workspace, workspace_bytes)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t n_units = static_cast<int64_t>(n_rows) * (n_ff / cuda::kUnit);
  const auto blocks = static_cast<unsigned>((n_units + kThreads - 1) / kThreads);
  const cuda::Q8Rows rows = cuda::q8_rows(workspace, n_ff);
  return cuda::with_act(weight_type, [&](auto act) {
    return cuda::launch_chained("swiglu_q8_kernel", swiglu_q8_kernel<decltype(act)::value>, blocks, kThreads, 0,
                                cuda::as_stream(stream), gate, up, n_units, out, rows);
  });
}

int launch_add(float* x, const float* y, int64_t n, void* stream) {
  if (n <= 0) return 0;
  return cuda::launch_chained("add_kernel", add_kernel, blocks_for(n), kThreads, 0, cuda::as_stream(stream), x, y, n);
}

int launch_add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim, void* stream) {
  if (n_rows <= 0 || dim <= 0) return 0;
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  return cuda::launch_chained("add_rows_kernel", add_rows_kernel, blocks_for(n), kThreads, 0, cuda::as_stream(stream),
                              rows, v, n, dim);
}

}  // namespace helios::kernels
