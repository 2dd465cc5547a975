#include <cstring>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_gather_blocks(const float* src, const int32_t* ids, int32_t n, int64_t floats_per_block,
                       float* dst) {
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * floats_per_block, src + ids[i] * floats_per_block,
                sizeof(float) * floats_per_block);
  }
}

void ref_scatter_blocks(const float* src, const int32_t* ids, int32_t n, int64_t floats_per_block,
                        float* dst) {
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(dst + ids[i] * floats_per_block, src + i * floats_per_block,
                sizeof(float) * floats_per_block);
  }
}

}  // namespace helios::kernels
