// The CPU backend: the reference kernels, with BLAS for f32 matrix products, llama.cpp-style
// integer kernels for quantized ones, and a thread pool for matmuls and attention.
#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "helios/backend.h"

extern "C" void openblas_set_num_threads(int);

namespace helios {
namespace {

constexpr size_t kMaxAllocFloats = (SIZE_MAX - 128) / sizeof(float);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) { openblas_set_num_threads(n_threads); }

  std::string name() const override { return "cpu"; }

  float* alloc(size_t n) override {
    if (n > kMaxAllocFloats) return nullptr;  // the byte count below would wrap around
    // 64-byte aligned for vector loads; at least one cache line so alloc(0) is still unique.
    const size_t bytes = ((n * sizeof(float) + 63) / 64 + 1) * 64;
    return static_cast<float*>(std::aligned_alloc(64, bytes));
  }
  void free(float* p) override { std::free(p); }
  void upload(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }
  void download(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }

  void embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                 float* out) override {
    kernels::ref_embedding(tokens, n_tokens, table, dim, out);
  }
  void rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps,
               float* out) override {
    kernels::ref_rmsnorm(x, w, n_rows, dim, eps, out);
  }
  // F32 through BLAS; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K as they are, with
  // llama.cpp's arithmetic (kernels/ref/quant_matmul*.cpp).
  bool supports_weight_type(TensorType type) const override {
    return type == TensorType::kF32 || kernels::ref_quantized_weight_type(static_cast<uint32_t>(type));
  }
  bool supports_kv_type(kernels::KvType) const override { return true; }  // f32, f16 and fp8 (E4M3)
  // Q4_K and Q6_K interleaved 4 rows at a time where that kernel is the faster: it needs 1.25 and
  // 1.5 multiplies per 32 products, the row kernels 2 (kernels/ref/quant_matmul_x4.cpp).
  WeightLayout matmul_layout(TensorType type, int32_t n_out, int32_t n_in) const override {
    const auto t = static_cast<uint32_t>(type);
    return kernels::ref_interleavable(t, n_out, n_in) && kernels::ref_interleaved_pays(t) ? WeightLayout::kInterleaved
                                                                                        : WeightLayout::kRows;
  }
  // Embedding tables stay in the file's type too: a token's row is dequantized when it is looked up.
  bool supports_embedding_type(TensorType type) const override { return supports_weight_type(type); }
  void embedding_rows(const int32_t* tokens, int32_t n_tokens, const WeightMatrix& table, float* out) override {
    if (table.type == TensorType::kF32) {
      kernels::ref_embedding(tokens, n_tokens, static_cast<const float*>(table.data), table.n_in, out);
      return;
    }
    for (int32_t t = 0; t < n_tokens; ++t) {
      // The table's type and row length were checked when it was loaded.
      (void)dequantize_weight_row(table, tokens[t], out + static_cast<int64_t>(t) * table.n_in);
    }
  }
  void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) override {
    const auto type = static_cast<uint32_t>(w.type);
    if (w.type == TensorType::kF32) {
      kernels::ref_matmul(x, static_cast<const float*>(w.data), n_rows, w.n_in, w.n_out, y);
      return;
    }
    activations_.resize(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(type, w.n_in)));
    kernels::ref_quantize_activations(type, x, n_rows, w.n_in, activations_.data());
    if (w.layout == WeightLayout::kInterleaved) {
      constexpr int32_t g = kernels::kInterleavedRows;  // threads split whole groups of rows
      pool_.parallel_for(w.n_out / g, [&](int64_t begin, int64_t end) {
        kernels::ref_matmul_interleaved(type, w.data, activations_.data(), n_rows, w.n_in, w.n_out,
                                        static_cast<int32_t>(begin * g), static_cast<int32_t>(end * g), y);
      });
      return;
    }
    pool_.parallel_for(w.n_out, [&](int64_t begin, int64_t end) {
      kernels::ref_matmul_quantized(type, w.data, activations_.data(), n_rows, w.n_in, w.n_out,
                                    static_cast<int32_t>(begin), static_cast<int32_t>(end), y);
    });
  }
  void rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
            const kernels::RopeParams& rope) override {
    kernels::ref_rope(x, positions, n_tokens, n_heads, head_dim, rope);
  }
  void kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                const kernels::PagedKV& cache) override {
    kernels::ref_kv_write(k, v, slots, n_tokens, cache);
  }
  void paged_attention(const float* q, const kernels::PagedKV& cache,
                       const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                       float* out) override {
    const kernels::CpuAttentionWork work =
        kernels::cpu_attention_work(plan, n_heads, cache.n_kv_heads, cache.head_dim);
    attention_parts_.resize(static_cast<size_t>(work.workspace_floats));
    // One share of items per thread, strided (see cpu_paged_attention).
    pool_.parallel_for(pool_.size(), [&](int64_t begin, int64_t end) {
      for (int64_t share = begin; share < end; ++share)
        kernels::cpu_paged_attention(q, cache, plan, n_heads, scale, work, share, pool_.size(),
                                     attention_parts_.data(), out);
    });
    if (work.n_splits == 1) return;
    pool_.parallel_for(static_cast<int64_t>(plan.n_tokens) * n_heads, [&](int64_t begin, int64_t end) {
      kernels::cpu_attention_merge(plan, n_heads, cache.head_dim, work, attention_parts_.data(), begin, end, out);
    });
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override {
    kernels::ref_swiglu(gate, up, n, out);
  }
  void add(float* x, const float* y, int64_t n) override { kernels::ref_add(x, y, n); }
  void exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1, float* top1_prob,
                  float* margin, float* entropy) override {
    kernels::cpu_exit_stats(logits, n_rows, n_vocab, top1, top1_prob, margin, entropy);  // logits are host memory
  }

 private:
  ThreadPool pool_;
  std::vector<uint8_t> activations_;  // quantized rows of x for the current matmul
  std::vector<float> attention_parts_;  // partial results of split attention contexts
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace helios
