// Several matrices in one matrix-vector launch (kernels::GemvProducts): which matrix and output
// row each warp computes. The 16-bit and 8-bit kernels both take 8 output rows per block of 256
// threads, a warp per row, and lay the matrices' rows one after another over the grid.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/kernels.h"

namespace helios::kernels::cuda {

constexpr int kGemvWarps = 8;  // output rows per block

// The matrices of one launch as the kernel reads them: block b serves matrix k where
// first_block[k] <= b < first_block[k + 1]. Only matrices with rows.
struct GemvTargets {
  const void* w[kMaxGemvProducts];
  float* y[kMaxGemvProducts];
  const float* bias[kMaxGemvProducts];
  bool accumulate[kMaxGemvProducts];
  int32_t n_out[kMaxGemvProducts];
  int32_t first_block[kMaxGemvProducts];
  int32_t n;
};

// The targets of the products, and the blocks they take; false for a product with rows but no
// matrix or output, too many products, or more blocks than a grid holds.
inline bool make_targets(const GemvProducts& products, GemvTargets* t, int32_t* n_blocks) {
  *t = GemvTargets{};
  int64_t blocks = 0;
  if (products.n < 0 || products.n > kMaxGemvProducts) return false;
  for (int k = 0; k < products.n; ++k) {
    const GemvProduct& p = products.at[k];
    if (p.n_out <= 0) continue;
    if (!p.w || !p.y) return false;
    t->w[t->n] = p.w;
    t->y[t->n] = p.y;
    t->bias[t->n] = p.bias;
    t->accumulate[t->n] = p.accumulate;
    t->n_out[t->n] = p.n_out;
    t->first_block[t->n] = static_cast<int32_t>(blocks);
    blocks += (p.n_out + kGemvWarps - 1) / kGemvWarps;
    ++t->n;
  }
  if (blocks > INT_MAX) return false;
  *n_blocks = static_cast<int32_t>(blocks);
  return true;
}

// Weight rows to be read in 16-byte loads need every matrix 16-byte aligned: their addresses
// OR-ed are, exactly when each is.
inline uintptr_t or_of_addresses(const GemvTargets& t) {
  uintptr_t a = 0;
  for (int k = 0; k < t.n; ++k) a |= reinterpret_cast<uintptr_t>(t.w[k]);
  return a;
}

// The targets of the launch for input rows r.. : each output from its row r.
inline GemvTargets from_row(const GemvTargets& t, int32_t r) {
  GemvTargets tr = t;
  for (int k = 0; k < t.n; ++k) tr.y[k] = t.y[k] + static_cast<int64_t>(r) * t.n_out[k];
  return tr;
}

// The matrix and output row warp `warp` of block `block` computes (none when o >= n_out). The
// matrix is picked with constant indices, so that in a kernel its fields stay parameters.
struct WarpRow {
  const void* w;
  float* y;
  const float* bias;
  bool accumulate;  // y[r, o] += the sum plus the bias, not y[r, o] = it
  int32_t n_out, o;
};
__host__ __device__ __forceinline__ WarpRow warp_row(const GemvTargets& t, int32_t block, int32_t warp) {
  WarpRow m{t.w[0], t.y[0], t.bias[0], t.accumulate[0], t.n_out[0], block * kGemvWarps + warp};
#pragma unroll
  for (int k = 1; k < kMaxGemvProducts; ++k) {
    if (k < t.n && block >= t.first_block[k]) {
      m = {t.w[k], t.y[k], t.bias[k], t.accumulate[k], t.n_out[k], (block - t.first_block[k]) * kGemvWarps + warp};
    }
  }
  return m;
}

}  // namespace helios::kernels::cuda
