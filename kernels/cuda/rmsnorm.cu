// RMSNorm on the GPU: one block per row; the sum of squares is reduced in double, as the CPU twin
// (ref_rmsnorm) accumulates it, so both agree to float rounding. The _q8 launchers also round the
// normed row to 8 bits for the next product (q8_rounding.cuh), bit for bit as launch_quantize_q8
// would, in the same launch.
#include <cuda_runtime.h>

#include "kernels/cuda/q8_rounding.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;

// What a norm does after writing its row: nothing, or round it to 8 bits.
struct KeepFloats {
  __device__ void operator()(const float*, int64_t) const {}
};
template <cuda::Act kAct>
struct RoundToQ8 {
  cuda::Q8Rows rows;
  __device__ void operator()(const float* row, int64_t r) const { cuda::round_row<kAct>(row, rows, r); }
};

template <typename Then>
__global__ void rmsnorm_kernel(const float* x, const float* weight, int32_t dim, float eps, float* out, Then then) {
  cuda::inputs_ready();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  __shared__ double partial[kThreads];
  double sum = 0;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) sum += static_cast<double>(xr[i] * xr[i]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(static_cast<float>(partial[0] / dim) + eps);
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * weight[i];
  then(o, blockIdx.x);
}

// x += y, then the norm of the new x. Each thread adds and later reads back the same elements, so
// no other thread's write is read before the barrier.
template <typename Then>
__global__ void add_rmsnorm_kernel(float* x, const float* y, const float* weight, int32_t dim, float eps, float* out,
                                   Then then) {
  cuda::inputs_ready();
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  __shared__ double partial[kThreads];
  double sum = 0;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] + yr[i];
    xr[i] = v;
    sum += static_cast<double>(v * v);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(static_cast<float>(partial[0] / dim) + eps);
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * weight[i];
  then(o, blockIdx.x);
}

// The norm launched with `then` rounding its rows for weight_type.
template <typename Launch>
int with_rounding(uint32_t weight_type, int32_t n_rows, int32_t dim, void* workspace, size_t workspace_bytes,
                  Launch&& launch) {
  if (n_rows <= 0) return 0;
  if (!cuda::q8_args_ok(weight_type, n_rows, dim, workspace, workspace_bytes)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const cuda::Q8Rows rows = cuda::q8_rows(workspace, dim);
  return cuda::with_act(weight_type, [&](auto act) { return launch(RoundToQ8<decltype(act)::value>{rows}); });
}

}  // namespace

int launch_rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim, float eps,
                   float* out, void* stream) {
  if (n_rows <= 0) return 0;
  return cuda::launch_chained("rmsnorm_kernel", rmsnorm_kernel<KeepFloats>, n_rows, kThreads, 0, cuda::as_stream(stream),
                              x, weight, dim, eps, out, KeepFloats{});
}

int launch_add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                       float eps, float* out, void* stream) {
  if (n_rows <= 0) return 0;
  return cuda::launch_chained("add_rmsnorm_kernel", add_rmsnorm_kernel<KeepFloats>, n_rows, kThreads, 0,
                              cuda::as_stream(stream), x, y, weight, dim, eps, out, KeepFloats{});
}

int launch_rmsnorm_q8(uint32_t weight_type, const float* x, const float* weight, int32_t n_rows, int32_t dim,
                      float eps, float* out, void* workspace, size_t workspace_bytes, void* stream) {
  return with_rounding(weight_type, n_rows, dim, workspace, workspace_bytes, [&](auto then) {
    return cuda::launch_chained("rmsnorm_kernel", rmsnorm_kernel<decltype(then)>, n_rows, kThreads, 0,
                                cuda::as_stream(stream), x, weight, dim, eps, out, then);
  });
}

int launch_add_rmsnorm_q8(uint32_t weight_type, float* x, const float* y, const float* weight, int32_t n_rows,
                          int32_t dim, float eps, float* out, void* workspace, size_t workspace_bytes, void* stream) {
  return with_rounding(weight_type, n_rows, dim, workspace, workspace_bytes, [&](auto then) {
    return cuda::launch_chained("add_rmsnorm_kernel", add_rmsnorm_kernel<decltype(then)>, n_rows, kThreads, 0,
                                cuda::as_stream(stream), x, y, weight, dim, eps, out, then);
  });
}

}  // namespace helios::kernels
