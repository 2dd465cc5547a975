#include "backend/fault_backend.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

namespace helios {
namespace {

constexpr std::string_view kValidFaults =
    "valid faults: backend_error_after_matmuls=N, stall_after_matmuls=N:SECONDS (comma-separated)";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parse_count(std::string_view text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return !text.empty() && ec == std::errc() && ptr == end && *out >= 0;
}

bool parse_seconds(std::string_view text, double* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return !text.empty() && ec == std::errc() && ptr == end && std::isfinite(*out) && *out > 0 && *out <= 3600;
}

class FaultBackend final : public Backend {
 public:
  FaultBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan, std::shared_ptr<const FaultTrigger> trigger)
      : inner_(std::move(inner)), plan_(plan), trigger_(std::move(trigger)) {}

  std::string name() const override { return inner_->name() + "+faults"; }
  Status error() const override {
    if (armed() && plan_.error_after_matmuls >= 0 && matmuls_.load() >= plan_.error_after_matmuls) {
      return internal_error("injected device fault after " + std::to_string(plan_.error_after_matmuls) +
                            " matmuls (HELIOS_FAULTS backend_error_after_matmuls)");
    }
    return inner_->error();
  }
  void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) override {
    if (!armed()) {
      inner_->matmul(x, w, n_rows, y);
      return;
    }
    if (plan_.stall_after_matmuls >= 0 && matmuls_.load() == plan_.stall_after_matmuls && !stalled_.exchange(true)) {
      spdlog::warn("injected stall: matmul {} blocks for {:g} s (HELIOS_FAULTS stall_after_matmuls)",
                   plan_.stall_after_matmuls + 1, plan_.stall_seconds);
      std::this_thread::sleep_for(std::chrono::duration<double>(plan_.stall_seconds));
      spdlog::warn("injected stall over after {:g} s", plan_.stall_seconds);
    }
    inner_->matmul(x, w, n_rows, y);
    matmuls_.fetch_add(1);
  }

  // Everything else is the inner backend's, so a run with faults takes the production path (its
  // weight layouts, device sampling and step graphs).
  float* alloc(size_t n) override { return inner_->alloc(n); }
  void free(float* p) override { inner_->free(p); }
  void upload(float* dst, const float* src, size_t n) override { inner_->upload(dst, src, n); }
  void download(float* dst, const float* src, size_t n) override { inner_->download(dst, src, n); }
  void synchronize() override { inner_->synchronize(); }
  float* alloc_host(size_t n) override { return inner_->alloc_host(n); }
  void free_host(float* p) override { inner_->free_host(p); }
  void copy_to_host(float* dst, const float* src, size_t n) override { inner_->copy_to_host(dst, src, n); }
  void copy_from_host(float* dst, const float* src, size_t n) override { inner_->copy_from_host(dst, src, n); }
  void copy_wait() override { inner_->copy_wait(); }
  void copy_fence() override { inner_->copy_fence(); }
  bool supports_weight_type(TensorType t) const override { return inner_->supports_weight_type(t); }
  WeightLayout matmul_layout(TensorType t, int32_t n_out, int32_t n_in) const override {
    return inner_->matmul_layout(t, n_out, n_in);
  }
  bool supports_kv_type(kernels::KvType t) const override { return inner_->supports_kv_type(t); }
  Status check_attention_shape(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) const override {
    return inner_->check_attention_shape(n_heads, n_kv_heads, head_dim);
  }
  void embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim, float* out) override {
    inner_->embedding(tokens, n_tokens, table, dim, out);
  }
  void rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps, float* out) override {
    inner_->rmsnorm(x, w, n_rows, dim, eps, out);
  }
  void rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
            const kernels::RopeParams& rope) override {
    inner_->rope(x, positions, n_tokens, n_heads, head_dim, rope);
  }
  void kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                const kernels::PagedKV& cache) override {
    inner_->kv_write(k, v, slots, n_tokens, cache);
  }
  void paged_attention(const float* q, const kernels::PagedKV& cache, const kernels::AttentionPlan& plan,
                       int32_t n_heads, float scale, float* out) override {
    inner_->paged_attention(q, cache, plan, n_heads, scale, out);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override { inner_->swiglu(gate, up, n, out); }
  void add(float* x, const float* y, int64_t n) override { inner_->add(x, y, n); }
  void add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim) override {
    inner_->add_rows(rows, v, n_rows, dim);
  }
  size_t free_device_bytes() const override { return inner_->free_device_bytes(); }
  Status reserve_scratch(const PassShape& pass) override { return inner_->reserve_scratch(pass); }
  bool supports_embedding_type(TensorType t) const override { return inner_->supports_embedding_type(t); }
  void embedding_rows(const int32_t* tokens, int32_t n_tokens, const WeightMatrix& table, float* out) override {
    inner_->embedding_rows(tokens, n_tokens, table, out);
  }
  void add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim, float eps,
                   float* out) override {
    inner_->add_rmsnorm(x, y, weight, n_rows, dim, eps, out);
  }
  void exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1, float* top1_prob,
                  float* margin, float* entropy) override {
    inner_->exit_stats(logits, n_rows, n_vocab, top1, top1_prob, margin, entropy);
  }
  void sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                   const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token, float* logprob) override {
    inner_->sample_rows(logits, n_vocab, rows, n_rows, adjust, n_adjust, token, logprob);
  }
  void exit_stats_and_sample(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1, float* top1_prob,
                             float* margin, float* entropy, const kernels::SampleRow* draws, int32_t n_draws,
                             const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token,
                             float* logprob) override {
    inner_->exit_stats_and_sample(logits, n_rows, n_vocab, top1, top1_prob, margin, entropy, draws, n_draws, adjust,
                                  n_adjust, token, logprob);
  }
  void begin_graph() override { inner_->begin_graph(); }
  void end_graph() override { inner_->end_graph(); }
  void set_graphs(bool on) override { inner_->set_graphs(on); }
  GraphCounters graph_counters() const override { return inner_->graph_counters(); }

 private:
  bool armed() const { return !trigger_ || trigger_->armed.load(); }

  std::unique_ptr<Backend> inner_;
  const FaultPlan plan_;
  const std::shared_ptr<const FaultTrigger> trigger_;
  std::atomic<int64_t> matmuls_{0};  // since armed
  std::atomic<bool> stalled_{false};
};

}  // namespace

std::string FaultPlan::describe() const {
  std::string out;
  if (error_after_matmuls >= 0) {
    out += "device error after " + std::to_string(error_after_matmuls) + " matmuls";
  }
  if (stall_after_matmuls >= 0) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", stall_seconds);
    out += (out.empty() ? "" : "; ") + std::string("a ") + seconds + " s stall after " +
           std::to_string(stall_after_matmuls) + " matmuls";
  }
  return out.empty() ? "none" : out;
}

StatusOr<FaultPlan> parse_fault_plan(std::string_view spec) {
  FaultPlan plan;
  std::vector<std::string_view> seen;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string_view name = trim(item.substr(0, eq));
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : trim(item.substr(eq + 1));
    for (std::string_view s : seen) {
      if (s == name) return invalid_argument("fault '" + std::string(name) + "' is given twice");
    }
    seen.push_back(name);
    if (name == "backend_error_after_matmuls") {
      if (!parse_count(value, &plan.error_after_matmuls)) {
        return invalid_argument("backend_error_after_matmuls: expected =N with N a count of matmuls (0 or more), "
                                "got '" + std::string(item) + "'");
      }
    } else if (name == "stall_after_matmuls") {
      const size_t colon = value.find(':');
      if (colon == std::string_view::npos || !parse_count(value.substr(0, colon), &plan.stall_after_matmuls) ||
          !parse_seconds(value.substr(colon + 1), &plan.stall_seconds)) {
        plan.stall_after_matmuls = -1;
        return invalid_argument("stall_after_matmuls: expected =N:SECONDS with N a count of matmuls (0 or more) and "
                                "SECONDS in (0, 3600], got '" + std::string(item) + "'");
      }
    } else {
      return invalid_argument("unknown fault '" + std::string(name) + "'; " + std::string(kValidFaults));
    }
  }
  return plan;
}

std::unique_ptr<Backend> make_fault_backend(std::unique_ptr<Backend> inner, const FaultPlan& plan,
                                            std::shared_ptr<const FaultTrigger> trigger) {
  return std::make_unique<FaultBackend>(std::move(inner), plan, std::move(trigger));
}

}  // namespace helios
