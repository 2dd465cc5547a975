// The compute backend: device memory and the operations of the forward pass. Chosen once, when
// the model loads; the forward pass calls it without knowing which device it drives.
//
// Every pointer an op takes is backend memory (from alloc()), except the AttentionPlan's index
// arrays and the token ids, which are host memory the backend copies as it needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "helios/status.h"
#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace helios {

// How a matrix's blocks lie in backend memory.
enum class WeightLayout : uint8_t {
  kRows,         // GGUF's: row after row
  kInterleaved,  // groups of kernels::kInterleavedRows rows, their blocks together (kernels::ref_interleave_weights)
};

// A weight matrix in backend memory, [n_out, n_in] in `type`'s GGUF blocks, laid out by `layout`.
struct WeightMatrix {
  const void* data = nullptr;
  TensorType type = TensorType::kF32;
  int32_t n_out = 0;
  int32_t n_in = 0;
  WeightLayout layout = WeightLayout::kRows;
};

// The largest pass a model runs (Backend::reserve_scratch): its tokens, its matrices, its
// attention's query heads and their width, and its vocabulary.
struct PassShape {
  int32_t n_tokens = 0;
  std::vector<WeightMatrix> matrices;
  int32_t n_heads = 0, head_dim = 0;
  int32_t n_vocab = 0;
};

// How a backend's step graphs went (Backend::graph_counters): steps run op by op, captured into
// a graph, and replayed from one.
struct GraphCounters {
  int64_t run = 0;
  int64_t captured = 0;
  int64_t replayed = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"

  // --- memory (required)
  // nullptr when out of memory (or when n_floats floats overflow the address space); Buffer
  // callers check empty(), nothing stores a null pointer for later.
  virtual float* alloc(size_t n_floats) = 0;
  virtual void free(float* p) = 0;
  virtual void upload(float* dst, const float* host_src, size_t n_floats) = 0;
  virtual void download(float* host_dst, const float* src, size_t n_floats) = 0;
  virtual void synchronize() {}
  // The first device call that failed (a CUDA or cuBLAS error naming the call), sticky: after it
  // the device's results are not to be trusted, so every later forward pass fails with it too.
  // OK on a backend whose calls cannot fail (the CPU: it reports out of memory through alloc).
  virtual Status error() const { return ok_status(); }
  // Weight types matmul() takes as they are; the loader turns others into F32.
  virtual bool supports_weight_type(TensorType type) const = 0;
  // The layout the loader stores a [n_out, n_in] matrix of `type` in for matmul() (never an
  // embedding table, whose rows are gathered); matmul() takes kRows matrices too.
  virtual WeightLayout matmul_layout(TensorType, int32_t /*n_out*/, int32_t /*n_in*/) const {
    return WeightLayout::kRows;
  }
  // KV cache element types kv_write and paged_attention take (the default: f32 only).
  virtual bool supports_kv_type(kernels::KvType type) const { return type == kernels::KvType::kF32; }
  // OK when paged_attention runs with these heads (the default: any); else INVALID_ARGUMENT saying
  // what this backend takes, so that a model it cannot run is refused at load.
  virtual Status check_attention_shape(int32_t /*n_heads*/, int32_t /*n_kv_heads*/, int32_t /*head_dim*/) const {
    return ok_status();
  }

  // --- ops (required), parameters as kernels::ref_<op>
  virtual void embedding(const int32_t* host_tokens, int32_t n_tokens, const float* table,
                         int32_t dim, float* out) = 0;
  virtual void rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim,
                       float eps, float* out) = 0;
  // y[r] = W x[r].  x: [n_rows, w.n_in]; y: [n_rows, w.n_out]
  virtual void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) = 0;
  // Several products of one input, each over its first n_rows rows: y = W x, plus bias on every
  // row where there is one (Q, K and V, biased in Qwen2; gate and up). A backend that prepares x
  // for a product (the CUDA backend rounds it to 8 bits for quantized weights) does it once for
  // them all. The default runs one matmul and one add_rows each, skipping outputs with no rows;
  // no y may overlap x.
  struct MatmulOutput {
    const WeightMatrix* w;
    int32_t n_rows;
    float* y;
    const float* bias = nullptr;  // [w->n_out], backend memory
  };
  virtual void matmuls(const float* x, std::initializer_list<MatmulOutput> outputs) {
    for (const MatmulOutput& o : outputs) {
      if (o.n_rows <= 0) continue;
      matmul(x, *o.w, o.n_rows, o.y);
      if (o.bias) add_rows(o.y, o.bias, o.n_rows, o.w->n_out);
    }
  }
  // out = rmsnorm(x) · weight (add_rmsnorm's, after x += residual, when residual is given), then
  // matmuls(out, outputs). A backend that rounds the products' input (the CUDA backend, to 8 bits
  // for quantized weights) rounds it as the norm writes it. The default: the two in turn.
  virtual void norm_matmuls(float* x, const float* residual, const float* weight, int32_t n_rows, int32_t dim,
                            float eps, float* out, std::initializer_list<MatmulOutput> outputs) {
    if (residual) {
      add_rmsnorm(x, residual, weight, n_rows, dim, eps, out);
    } else {
      rmsnorm(x, weight, n_rows, dim, eps, out);
    }
    matmuls(out, outputs);
  }
  // out = swiglu(gate, up) over n_rows rows of w.n_in (out may be gate), then y = W out, and with
  // a residual, residual += y: the feed-forward's down projection into the residual stream. Its
  // input is rounded as it is written where norm_matmuls rounds, and a backend paying per launch
  // adds the product to the residual as it writes it, leaving y unwritten. The default: the ops in
  // turn.
  virtual void swiglu_matmul(const float* gate, const float* up, int32_t n_rows, float* out, const WeightMatrix& w,
                             float* y, float* residual) {
    swiglu(gate, up, static_cast<int64_t>(n_rows) * w.n_in, out);
    matmul(out, w, n_rows, y);
    if (residual) add(residual, y, static_cast<int64_t>(n_rows) * w.n_out);
  }
  // rope.freq_factors: backend memory [n_rot/2], or null (see kernels::RopeParams).
  virtual void rope(float* x, const int32_t* host_positions, int32_t n_tokens, int32_t n_heads,
                    int32_t head_dim, const kernels::RopeParams& rope) = 0;
  virtual void kv_write(const float* k, const float* v, const int32_t* host_slots,
                        int32_t n_tokens, const kernels::PagedKV& cache) = 0;
  // The attention's inputs: rope on q's first n_q rows (n_heads heads, at host_q_positions) and on
  // k's first n_kv rows (at host_kv_positions), in place, then kv_write of k and v into host_slots.
  // The default: the three ops in turn, which a backend paying per launch fuses.
  virtual void rope_kv_write(float* q, const int32_t* host_q_positions, int32_t n_q, int32_t n_heads, float* k,
                             const float* v, const int32_t* host_kv_positions, const int32_t* host_slots,
                             int32_t n_kv, const kernels::RopeParams& params, const kernels::PagedKV& cache) {
    if (n_q > 0) rope(q, host_q_positions, n_q, n_heads, cache.head_dim, params);
    rope(k, host_kv_positions, n_kv, cache.n_kv_heads, cache.head_dim, params);
    kv_write(k, v, host_slots, n_kv, cache);
  }
  virtual void paged_attention(const float* q, const kernels::PagedKV& cache,
                               const kernels::AttentionPlan& host_plan, int32_t n_heads,
                               float scale, float* out) = 0;
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // rows[r] += v for each of n_rows rows of dim, as kernels::ref_add_rows. The default: one add
  // per row, which a backend paying per launch overrides.
  virtual void add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim) {
    for (int32_t r = 0; r < n_rows; ++r) add(rows + static_cast<int64_t>(r) * dim, v, dim);
  }

  // --- optional: each has a default built from the ops above or from the reference twin run on
  // downloaded data, so a backend overrides only what it does faster.
  // Bytes of device memory still free (after the weights and the forward pass's activations, to
  // size the KV cache); 0 when the backend has no memory of its own (the CPU), i.e. size from
  // physical memory instead.
  virtual size_t free_device_bytes() const { return 0; }
  // Takes now the scratch memory the ops would otherwise allocate at their first use in a pass as
  // large as `pass`, so that a KV cache sized afterwards from free_device_bytes() leaves room for
  // it. RESOURCE_EXHAUSTED when it does not fit.
  virtual Status reserve_scratch(const PassShape& /*pass*/) { return ok_status(); }
  // Embedding-table types embedding_rows() gathers from as they are (the default: F32 only); the
  // loader turns a table of another type into F32.
  virtual bool supports_embedding_type(TensorType type) const { return type == TensorType::kF32; }
  // out[t] = row host_tokens[t] of `table` ([n_vocab, dim] = [table.n_out, table.n_in], F32 or a
  // type supports_embedding_type takes; in kRows or, shared with a tied LM head, in the layout
  // matmul_layout gives) as f32: a quantized table is dequantized row by row. The default gathers
  // F32 tables with embedding().  out: [n_tokens, table.n_in]
  virtual void embedding_rows(const int32_t* host_tokens, int32_t n_tokens, const WeightMatrix& table,
                              float* out);
  // x += y, then out = rmsnorm(x) · weight, as kernels::ref_add_rmsnorm.
  virtual void add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows,
                           int32_t dim, float eps, float* out);
  // Exit-confidence statistics of each row of logits into host arrays [n_rows], as
  // kernels::ref_exit_stats.
  virtual void exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* host_top1,
                          float* host_top1_prob, float* host_margin, float* host_entropy);
  // A token drawn from each of n_rows rows of logits (rows of n_vocab; SampleRow::logits_row says
  // which) as kernels::ref_sample_rows, into host arrays [n_rows], so the rows need not come down.
  // host_adjust: [n_adjust], the rows' ranges of it. The default downloads the rows for the twin.
  virtual void sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* host_rows, int32_t n_rows,
                           const kernels::LogitAdjust* host_adjust, int32_t n_adjust, int32_t* host_token,
                           float* host_logprob);
  // exit_stats of n_rows rows, then sample_rows of draws among them (rows of n_vocab), with one
  // wait for the device for both. The default: the two in turn.
  virtual void exit_stats_and_sample(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* host_top1,
                                     float* host_top1_prob, float* host_margin, float* host_entropy,
                                     const kernels::SampleRow* host_draws, int32_t n_draws,
                                     const kernels::LogitAdjust* host_adjust, int32_t n_adjust, int32_t* host_token,
                                     float* host_logprob) {
    exit_stats(logits, n_rows, n_vocab, host_top1, host_top1_prob, host_margin, host_entropy);
    if (n_draws > 0) {
      sample_rows(logits, n_vocab, host_draws, n_draws, host_adjust, n_adjust, host_token, host_logprob);
    }
  }

  // --- step graphs, optional (CUDA graphs)
  // The ops from begin_graph() to end_graph(), or to the first call that waits for the device
  // (download, upload, exit_stats, sample_rows, synchronize), are one step the backend may record
  // and replay in one launch when a later step makes the same launches. The ops read their host
  // arrays when called, as always. The default: ops run as they come.
  virtual void begin_graph() {}
  virtual void end_graph() {}
  // Step graphs on (the default where there are any) or off (engine.cuda_graphs).
  virtual void set_graphs(bool /*on*/) {}
  virtual GraphCounters graph_counters() const { return {}; }

  // --- block copies beside the forward pass (KV swap), optional
  // Host memory the device copies to and from without staging it (pinned, on CUDA); nullptr
  // when none can be had (HostBuffer then takes plain memory). The default: plain memory.
  virtual float* alloc_host(size_t n_floats);
  virtual void free_host(float* p);
  // Copies on a stream of their own, done when copy_wait() returns: they may run while another
  // thread's forward pass computes, so they must touch memory that pass does not. The default:
  // download and upload.
  virtual void copy_to_host(float* host_dst, const float* src, size_t n_floats) { download(host_dst, src, n_floats); }
  virtual void copy_from_host(float* dst, const float* host_src, size_t n_floats) { upload(dst, host_src, n_floats); }
  virtual void copy_wait() {}
  // Copies issued after this wait for the work enqueued before it (the passes that wrote the
  // blocks they read, or still read the blocks they overwrite). The default: nothing to order.
  virtual void copy_fence() {}
};

// `n_threads` ≤ 0 means one per core.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
// Row `row` of a quantized matrix in host memory (the CPU backend's) as n_in floats, in either
// layout: an interleaved row is taken back out of its group first.
Status dequantize_weight_row(const WeightMatrix& w, int32_t row, float* out);
// "cpu", and in CUDA builds "cuda" (device 0) or "cuda:N"; INVALID_ARGUMENT listing what this
// build supports (and how to build the CUDA backend when it is missing).
StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, int n_threads);

// Backend memory that frees itself. Empty when the backend had none left: every owner checks.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, size_t n_floats)
      : backend_(backend), data_(backend->alloc(n_floats)), size_(data_ ? n_floats : 0) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(backend_, o.backend_);
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  void reset() {
    if (data_) backend_->free(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

// Host memory for copies to and from a backend (the swap space): the backend's alloc_host where it
// gives some, else plain memory (copies from it are then staged by the driver). Uninitialised.
// Empty only when there is no host memory left.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Backend* backend, size_t n_floats);

  float* get() const { return data_.get(); }
  size_t size() const { return data_ ? size_ : 0; }
  bool empty() const { return data_ == nullptr; }
  void reset() { data_.reset(); }

 private:
  // Frees through the backend whose alloc_host gave the memory; null: plain memory.
  struct Free {
    Backend* backend;  // no initializer: a default-constructible deleter inside the class
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
};

}  // namespace helios
