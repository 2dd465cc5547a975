// A backend with a fixed amount of device memory, like a GPU: the CPU backend's ops, an alloc()
// that returns nullptr once `capacity_bytes` would be exceeded, and free_device_bytes() reporting
// what is left; a device fault on demand, and a pause on demand. For testing that every
// allocation failure becomes a Status, what the KV cache is sized from, that a device error fails
// loudly, and what an engine does to a request queued while its loop is inside a pass.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "helios/backend.h"

namespace helios::testing {

class LimitedBackend final : public Backend {
 public:
  explicit LimitedBackend(size_t capacity_bytes) : cpu_(make_cpu_backend(1)), capacity_bytes_(capacity_bytes) {}

  // Device faults, as a failed CUDA call: after `n` more matmuls, error() reports one (sticky).
  void fail_after_matmuls(int64_t n) { matmuls_before_fault_ = n; }
  Status error() const override {
    return matmuls_before_fault_ == 0 ? internal_error("injected device fault in matmul") : ok_status();
  }

  // A pause, as a long kernel: the n-th matmul from now (n >= 1) blocks until resume().
  void pause_at_matmul(int64_t n) {
    std::lock_guard<std::mutex> lock(pause_mu_);
    matmuls_before_pause_ = n;
  }
  void wait_until_paused() {
    std::unique_lock<std::mutex> lock(pause_mu_);
    pause_cv_.wait(lock, [&] { return paused_; });
  }
  void resume() {
    {
      std::lock_guard<std::mutex> lock(pause_mu_);
      paused_ = false;
    }
    pause_cv_.notify_all();
  }

  size_t used_bytes() const {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    return used_bytes_;
  }
  int n_refused() const {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    return n_refused_;
  }

  std::string name() const override { return "limited"; }
  size_t free_device_bytes() const override { return capacity_bytes_ - used_bytes(); }
  // Attention that cannot run models whose heads are over this many per KV head, as a GPU kernel's.
  void limit_query_heads_per_kv_head(int32_t n) { max_group_ = n; }
  Status check_attention_shape(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) const override {
    if (max_group_ > 0 && n_heads / n_kv_heads > max_group_) {
      return invalid_argument("this backend's attention takes at most " + std::to_string(max_group_) +
                              " query heads per KV head");
    }
    return cpu_->check_attention_shape(n_heads, n_kv_heads, head_dim);
  }
  // Allocations come from two threads (an engine's loop, and Model::load_layers_range beside it).
  float* alloc(size_t n_floats) override {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    if (n_floats > (capacity_bytes_ - used_bytes_) / sizeof(float)) {
      ++n_refused_;
      return nullptr;
    }
    float* p = cpu_->alloc(n_floats);
    if (p) {
      sizes_[p] = n_floats * sizeof(float);
      used_bytes_ += n_floats * sizeof(float);
    }
    return p;
  }
  void free(float* p) override {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    used_bytes_ -= sizes_.at(p);
    sizes_.erase(p);
    cpu_->free(p);
  }
  void upload(float* dst, const float* src, size_t n) override { cpu_->upload(dst, src, n); }
  void download(float* dst, const float* src, size_t n) override { cpu_->download(dst, src, n); }
  bool supports_weight_type(TensorType type) const override { return cpu_->supports_weight_type(type); }
  void embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim, float* out) override {
    cpu_->embedding(tokens, n_tokens, table, dim, out);
  }
  void rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps, float* out) override {
    cpu_->rmsnorm(x, w, n_rows, dim, eps, out);
  }
  void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) override {
    if (matmuls_before_fault_ > 0) --matmuls_before_fault_;
    {
      std::unique_lock<std::mutex> lock(pause_mu_);
      if (matmuls_before_pause_ > 0 && --matmuls_before_pause_ == 0) {
        paused_ = true;
        pause_cv_.notify_all();
        pause_cv_.wait(lock, [&] { return !paused_; });
      }
    }
    cpu_->matmul(x, w, n_rows, y);
  }
  void rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
            const kernels::RopeParams& rope) override {
    cpu_->rope(x, positions, n_tokens, n_heads, head_dim, rope);
  }
  void kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                const kernels::PagedKV& cache) override {
    cpu_->kv_write(k, v, slots, n_tokens, cache);
  }
  void paged_attention(const float* q, const kernels::PagedKV& cache, const kernels::AttentionPlan& plan,
                       int32_t n_heads, float scale, float* out) override {
    cpu_->paged_attention(q, cache, plan, n_heads, scale, out);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override { cpu_->swiglu(gate, up, n, out); }
  void add(float* x, const float* y, int64_t n) override { cpu_->add(x, y, n); }

 private:
  std::unique_ptr<Backend> cpu_;
  size_t capacity_bytes_;
  mutable std::mutex alloc_mu_;  // guards used_bytes_, n_refused_, sizes_
  size_t used_bytes_ = 0;
  int n_refused_ = 0;
  int64_t matmuls_before_fault_ = -1;  // -1: never
  std::mutex pause_mu_;
  std::condition_variable pause_cv_;
  int64_t matmuls_before_pause_ = 0;   // 0: no pause set
  bool paused_ = false;
  std::unordered_map<const float*, size_t> sizes_;
  int32_t max_group_ = 0;  // 0: any
};

}  // namespace helios::testing
