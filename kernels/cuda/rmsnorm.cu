// RMSNorm on the GPU: one block per row; the sum of squares is reduced in double, as the CPU twin
// (ref_rmsnorm) accumulates it, so both agree to float rounding.
#include <cuda_runtime.h>

#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(const float* x, const float* weight, int32_t dim, float eps, float* out) {
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
}

// x += y, then the norm of the new x. Each thread adds and later reads back the same elements, so
// no other thread's write is read before the barrier.
__global__ void add_rmsnorm_kernel(float* x, const float* y, const float* weight, int32_t dim,
                                   float eps, float* out) {
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
}

}  // namespace

int launch_rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim, float eps,
                   float* out, void* stream) {
  if (n_rows <= 0) return 0;
  rmsnorm_kernel<<<n_rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, weight, dim, eps, out);
  return static_cast<int>(cudaGetLastError());
}

int launch_add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                       float eps, float* out, void* stream) {
  if (n_rows <= 0) return 0;
  add_rmsnorm_kernel<<<n_rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, weight, dim, eps, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace helios::kernels
