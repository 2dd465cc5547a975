// 16-bit weights (half or bfloat16), f32 activations: the twins of the GPU's matrix-vector kernel.
#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"

namespace helios::kernels {

namespace {

template <float (*kToFloat)(uint16_t)>
void matmul_16bit(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in, int32_t n_out, float* y) {
  for (int32_t o = 0; o < n_out; ++o) {
    const uint16_t* wo = w + static_cast<int64_t>(o) * n_in;
    for (int32_t r = 0; r < n_rows; ++r) {
      const float* xr = x + static_cast<int64_t>(r) * n_in;
      float acc = 0;
      for (int32_t i = 0; i < n_in; ++i) acc += kToFloat(wo[i]) * xr[i];
      y[static_cast<int64_t>(r) * n_out + o] = acc;
    }
  }
}

}  // namespace

void ref_matmul_f16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in, int32_t n_out, float* y) {
  matmul_16bit<fp16_to_fp32>(x, w, n_rows, n_in, n_out, y);
}

void ref_matmul_bf16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in, int32_t n_out, float* y) {
  matmul_16bit<bf16_to_fp32>(x, w, n_rows, n_in, n_out, y);
}

void ref_f32_to_f16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(x[i]);
}

void ref_f32_to_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(x[i]);
}

}  // namespace helios::kernels
