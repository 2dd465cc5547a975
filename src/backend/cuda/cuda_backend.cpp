// The CUDA backend: the ops of the forward pass as the kernels of kernels/cuda/ and cuBLAS, in
// order on one stream. Host arrays (token ids, positions, slots, the attention plan) are copied to
// device memory as needed; an array sent unchanged for every layer of a pass is sent once.
//
// Weights: F32 matrices go through cuBLAS SGEMM; F16 and BF16 matrices stay in 16 bits (half the
// bytes to read) and go through a matrix-vector kernel for up to kGemvMaxRows rows (decode) and
// cublasGemmEx, with activations rounded to the weights' type, above that (prefill). Quantized matrices (Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) stay in their GGUF blocks, so decode reads the file's
// bytes: for up to cuda_gemv_max_rows rows (32 to 64 by type: decode batches) the activations are
// rounded to 8 bits as the CPU backend rounds them and a matrix-vector kernel takes integer dot
// products with the weights unpacked in registers (the CPU's integer sums), 8 rows a launch; above
// that a slice of kDequantRows rows at a time is dequantized to f16 for cublasGemmEx. Other types
// arrive as F32 (the loader dequantizes them).
//
// Swap copies go through pinned host memory (alloc_host) on a copy stream of their own, so they
// overlap the forward pass on the compute stream: copy_fence makes them wait for the compute work
// enqueued so far (earlier passes wrote the blocks, and a pass need not end in a wait), the engine
// copies only blocks the pass in flight leaves alone, and copy_wait ends them before the blocks
// are used.
//
// Step graphs: between begin_graph() and end_graph() (a stretch of a decode step between reads of its
// results) each op is recorded as a launch with its arguments instead of run, and its host arrays
// are copied into pinned memory. At the step's end the arrays go up into device buffers that keep
// their place from step to step, and the launches run one of three ways (StepGraphCache): op by
// op the first time their key (every argument of every launch, as bytes) is seen, captured into a
// CUDA graph the second time, and replayed from that graph after. A graph holds nothing its key
// does not say, so a replay is the launches the step asked for. Attention's launch sizes follow
// the contexts in coarse steps, so a decode keeps its key for many tokens. A capture that fails
// turns graphs off (logged once) and the step runs op by op.
//
// Errors: a failing CUDA or cuBLAS call is logged to stderr with the call's name and error; the
// op returns without its result and error() reports the first failure from then on (the forward
// pass returns it, the engine fails its requests with INTERNAL). Nothing aborts.
#include "backend/cuda/cuda_backend.h"
#include "backend/step_graph_cache.h"
#include "helios/tensor_type.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <unordered_map>
#include <vector>

namespace helios {
namespace {

constexpr int32_t kGemvMaxRows = 8;   // rows a matrix-vector launch serves; F16/BF16 take more via cuBLAS
constexpr int32_t kDequantRows = 16384;  // weight rows dequantized at a time for a quantized GEMM
constexpr int32_t kSampleGroup = 32;     // rows sampled in one launch (the sort's workspace grows with them)

// Scratch bytes of a cuBLAS product of n_rows activation rows with w: the rows in 16 bits, and,
// for a quantized matrix, a slice of up to kDequantRows of its rows dequantized.
size_t half_rows_bytes(int32_t n_rows, const WeightMatrix& w) {
  return static_cast<size_t>(n_rows) * w.n_in * sizeof(uint16_t);
}
size_t dequant_slice_bytes(const WeightMatrix& w) {
  return static_cast<size_t>(std::min(kDequantRows, w.n_out)) * w.n_in * sizeof(uint16_t);
}
// Scratch bytes of the exit statistics of n_rows rows: top-1 id, its probability, margin, entropy.
size_t stats_bytes(int32_t n_rows) { return 4 * sizeof(float) * static_cast<size_t>(n_rows); }

// Sampling's arguments and results on the device: [rows | adjust | token | logprob], 8-byte aligned.
struct SampleIoLayout {
  size_t adjust_at, out_at, total;
};
SampleIoLayout sample_io_layout(size_t n_rows, size_t n_adjust) {
  auto aligned8 = [](size_t bytes) { return (bytes + 7) / 8 * 8; };
  const size_t adjust_at = aligned8(sizeof(kernels::SampleRow) * n_rows);
  const size_t out_at = adjust_at + aligned8(sizeof(kernels::LogitAdjust) * n_adjust);
  return {adjust_at, out_at, out_at + 8 * n_rows};
}
constexpr size_t kReservedAdjustPerRow = 64;  // penalized or biased tokens a row brings, taken up front

bool quantized_type(TensorType t) {
  switch (t) {
    case TensorType::kQ8_0: case TensorType::kQ4_0: case TensorType::kQ4_1: case TensorType::kQ5_0:
    case TensorType::kQ5_1: case TensorType::kQ4_K: case TensorType::kQ5_K: case TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int32_t gemv_max_rows(const WeightMatrix& w) { return cuda_gemv_max_rows(w.type, w.n_in); }

constexpr int kMaxLoggedErrors = 20;  // a sticky fault would otherwise log once per op
constexpr size_t kMaxStagedArrays = 64;
constexpr size_t kMaxStepGraphs = 64;           // captured steps kept (batch sizes x context steps)
constexpr size_t kBlasWorkspaceBytes = 32 << 20;  // cuBLAS's own, so a capture never allocates

// Every argument of a recorded launch goes into its step's key, field by field (no padding bytes).
template <typename T>
void append_key(std::string& key, const T& v) {
  static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T>,
                "a launch argument of another type needs an append_key of its own");
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void append_key(std::string& key, const WeightMatrix& w) {
  append_key(key, w.data);
  append_key(key, w.type);
  append_key(key, w.n_out);
  append_key(key, w.n_in);
  append_key(key, w.layout);
}
void append_key(std::string& key, const kernels::PagedKV& c) {
  append_key(key, c.k);
  append_key(key, c.v);
  append_key(key, c.n_blocks);
  append_key(key, c.block_size);
  append_key(key, c.n_kv_heads);
  append_key(key, c.head_dim);
  append_key(key, c.type);
}
void append_key(std::string& key, const kernels::AttentionPlan& p) {
  append_key(key, p.n_tokens);
  append_key(key, p.token_seq);
  append_key(key, p.positions);
  append_key(key, p.block_tables);
  append_key(key, p.max_blocks_per_seq);
}
void append_key(std::string& key, const kernels::RopeParams& r) {
  append_key(key, r.n_rot);
  append_key(key, r.freq_base);
  append_key(key, r.freq_scale);
  append_key(key, r.freq_factors);
  append_key(key, r.interleaved);
  append_key(key, r.ext_factor);
  append_key(key, r.corr_low);
  append_key(key, r.corr_high);
  append_key(key, r.mscale);
}
void append_key(std::string& key, const kernels::GemvProducts& products) {
  append_key(key, products.n);
  for (int32_t k = 0; k < products.n; ++k) {
    const kernels::GemvProduct& p = products.at[k];
    append_key(key, p.w);
    append_key(key, p.n_out);
    append_key(key, p.y);
    append_key(key, p.bias);
    append_key(key, p.accumulate);
  }
}
void append_key(std::string& key, const kernels::AttentionTiles& t) {
  append_key(key, t.first);
  append_key(key, t.n_tiles);
  append_key(key, t.tile_tokens);
  append_key(key, t.span.longest);
  append_key(key, t.span.total);
  append_key(key, t.general_loads);
}

// The contexts attention's launch is sized by, rounded up (the longest to 256 positions, the sum to
// within an eighth) so that a decode's launch, and its step's key, stays the same for many tokens.
// Larger is safe: a block past its tile's context does nothing.
kernels::ContextSpan coarse_span(kernels::ContextSpan s) {
  auto round_up = [](int64_t v, int64_t step) { return (v + step - 1) / step * step; };
  s.longest = static_cast<int32_t>(round_up(s.longest, 256));
  const int64_t total = std::max<int64_t>(s.total, s.longest);
  s.total = round_up(total, std::max<int64_t>(256, static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(total))) / 8));
  return s;
}

// A host int array mirrored in device memory, sent again only when its contents change.
struct StagedInts {
  int32_t* device = nullptr;
  size_t capacity = 0;
  std::vector<int32_t> shadow;  // what `device` holds
};

enum Scratch {
  kScratchHalfX,
  kScratchQ8X,
  kScratchAttention,
  kScratchStats,
  kScratchHalfW,
  kScratchSample,
  kScratchSampleIo,
  kScratchCount
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override;
  Status init();

  std::string name() const override { return "cuda:" + std::to_string(device_); }

  float* alloc(size_t n) override;
  void free(float* p) override;
  void upload(float* dst, const float* src, size_t n) override;
  void download(float* dst, const float* src, size_t n) override;
  void synchronize() override;
  bool supports_weight_type(TensorType type) const override {
    return type == TensorType::kF32 || type == TensorType::kF16 || type == TensorType::kBF16 || quantized_type(type);
  }
  bool supports_kv_type(kernels::KvType) const override { return true; }  // f32, f16 and fp8 (E4M3)
  Status check_attention_shape(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) const override {
    if (kernels::paged_attention_supports(n_heads, n_kv_heads, head_dim)) return ok_status();
    return invalid_argument("the CUDA backend's attention takes head_dim <= 256 and query heads a multiple of the "
                            "KV heads; this model has " + std::to_string(n_heads) + " query heads over " +
                            std::to_string(n_kv_heads) + " KV heads of " + std::to_string(head_dim) +
                            ": serve it on the CPU backend (engine.backend: cpu)");
  }

  void embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                 float* out) override;
  void rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps,
               float* out) override;
  void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) override;
  void matmuls(const float* x, std::initializer_list<MatmulOutput> outputs) override;
  void rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
            const kernels::RopeParams& rope) override;
  void kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                const kernels::PagedKV& cache) override;
  void rope_kv_write(float* q, const int32_t* q_positions, int32_t n_q, int32_t n_heads, float* k, const float* v,
                     const int32_t* kv_positions, const int32_t* slots, int32_t n_kv, const kernels::RopeParams& rope,
                     const kernels::PagedKV& cache) override;
  void paged_attention(const float* q, const kernels::PagedKV& cache,
                       const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                       float* out) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void norm_matmuls(float* x, const float* residual, const float* weight, int32_t n_rows, int32_t dim, float eps,
                    float* out, std::initializer_list<MatmulOutput> outputs) override;
  void swiglu_matmul(const float* gate, const float* up, int32_t n_rows, float* out, const WeightMatrix& w,
                     float* y, float* residual) override;
  void add(float* x, const float* y, int64_t n) override;
  void add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim) override;

  size_t free_device_bytes() const override;
  Status reserve_scratch(const PassShape& pass) override;
  void add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                   float eps, float* out) override;
  void exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                  float* top1_prob, float* margin, float* entropy) override;
  void sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                   const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token, float* logprob) override;
  void exit_stats_and_sample(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1, float* top1_prob,
                             float* margin, float* entropy, const kernels::SampleRow* draws, int32_t n_draws,
                             const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token,
                             float* logprob) override;
  Status error() const override {
    std::lock_guard<std::mutex> lock(error_mu_);
    return first_error_.empty() ? ok_status() : internal_error(first_error_);
  }

  float* alloc_host(size_t n) override;
  void free_host(float* p) override;
  void copy_to_host(float* host_dst, const float* src, size_t n) override;
  void copy_from_host(float* dst, const float* host_src, size_t n) override;
  void copy_wait() override;
  void copy_fence() override;

  void begin_graph() override;
  void end_graph() override;
  void set_graphs(bool on) override;
  GraphCounters graph_counters() const override { return counters_; }

 private:
  // Runs fn(*this, args...) now or, while a step records, adds it to the step and its arguments to
  // the step's key. fn captures nothing: all it reads is in args, so the key says all it does.
  template <typename Launch, typename... Args>
  void launch(const char* what, Launch fn, const Args&... args);
  // A recorded step's index arrays: slot i of each step keeps its device buffer from step to step.
  const int32_t* stage_for_step(const int32_t* host, size_t n);
  // Device memory a recorded launch may still name is freed after the step runs, not before.
  void release(void* p);
  bool capture_step();  // false: graphs are off now and the step has not run
  // The device halves of exit_stats and sample_rows: launched, their results left in scratch
  // memory (16 and 8 bytes per row) for download_results, which brings parts down in one wait.
  const uint8_t* enqueue_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab);
  const uint8_t* enqueue_sample(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                                const kernels::LogitAdjust* adjust, int32_t n_adjust);
  bool download_results(std::initializer_list<std::pair<const uint8_t*, size_t>> parts, std::vector<uint8_t>& host);

  // false (and a log line naming `call`) on error.
  // During a capture, failures on the capturing thread fail the capture instead (capture_error_).
  bool ok(cudaError_t e, const char* call) const;
  bool capture_failed(const std::string& what) const;
  bool ok_launch(int e, const char* launcher) const { return ok(static_cast<cudaError_t>(e), launcher); }
  bool ok_blas(cublasStatus_t s, const char* call) const;
  void bind() const { cudaSetDevice(device_); }  // the device is per host thread in CUDA
  // Copies a host index array to the device, reusing the copy while its contents stay the same.
  // Pointers it returns stay valid until the next trim_staged().
  const int32_t* stage(const int32_t* host, size_t n);
  // Drops every staged array once callers have moved on to more than kMaxStagedArrays of them.
  // Called at the start of an op, never between two stage() calls whose pointers one launch uses.
  void trim_staged();
  void* scratch(Scratch which, size_t bytes);
  // The 8-bit matrix-vector path: x's first n_rows rows rounded for w's type into scratch (null on
  // error), and products of one type, width and row count over rows rounded so, their biases
  // added as they are written, in one launch per 8 rows.
  void* round_q8(const float* x, const WeightMatrix& w, int32_t n_rows);
  // matmuls' outputs sorted into its launches: those on the 8-bit kernel, which share one rounding
  // of x's first rounded_rows rows for the lead's type; F16/BF16 matrix-vector products; the rest.
  struct MatmulPlan {
    const MatmulOutput* lead = nullptr;
    int32_t rounded_rows = 0;
    std::vector<const MatmulOutput*> rounded, halves, others;
  };
  MatmulPlan plan_matmuls(std::initializer_list<MatmulOutput> outputs) const;
  // The plan's launches; q8: x rounded for plan.lead (nothing runs on the 8-bit kernel without it).
  void run_matmuls(const float* x, MatmulPlan plan, const void* q8);
  void gemv_q8(const void* q8, TensorType type, int32_t n_rows, int32_t n_in, const kernels::GemvProducts& products);
  // The same for F16 or BF16 matrices over x itself.
  void gemv_16bit(const float* x, TensorType type, int32_t n_rows, int32_t n_in, const kernels::GemvProducts& products);
  cudaError_t grow_scratch(Scratch which, size_t bytes);  // at least `bytes` in scratch_[which]

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // swap copies, beside the forward pass on stream_
  cudaEvent_t fence_ = nullptr;          // stream_'s work so far, for copy_stream_ to wait on
  std::mutex fence_mu_;                  // copies may be issued from another thread than the pass
  cublasHandle_t blas_ = nullptr;
  std::unordered_map<const int32_t*, StagedInts> staged_;  // by host array
  std::vector<int32_t> tile_first_;  // attention's query tiles (one host array, staged like the plan's)
  void* scratch_[kScratchCount] = {};
  size_t scratch_bytes_[kScratchCount] = {};
  void* blas_workspace_ = nullptr;

  // step graphs
  struct StepCopy {
    const int32_t* host;
    size_t offset;  // into pinned_
    size_t n;
    int32_t* device;
  };
  struct DeviceInts {
    int32_t* device = nullptr;
    size_t capacity = 0;
  };
  bool graphs_on_ = true;
  std::atomic<bool> recording_{false};
  std::string key_;
  std::vector<std::function<void()>> pending_;
  std::vector<StepCopy> step_copies_;
  std::vector<DeviceInts> step_slots_;
  int32_t* pinned_ = nullptr;  // the step's index arrays on their way up
  size_t pinned_capacity_ = 0, pinned_used_ = 0;
  cudaEvent_t pinned_free_ = nullptr;  // the last step's copies out of pinned_ are done
  bool pinned_busy_ = false;
  std::mutex released_mu_;
  std::vector<void*> released_;
  StepGraphCache graphs_{kMaxStepGraphs};
  GraphCounters counters_;
  mutable std::atomic<bool> capturing_{false};
  std::atomic<std::thread::id> capture_thread_{};  // read by ops on other threads
  mutable std::string capture_error_;

  mutable std::mutex error_mu_;  // copies run on another host thread than the forward pass
  mutable int n_errors_ = 0;
  mutable std::string first_error_;  // sticky: after it the device's results are not trusted
};

template <typename Launch, typename... Args>
void CudaBackend::launch(const char* what, Launch fn, const Args&... args) {
  static_assert(std::is_empty_v<Launch>, "a launch reads nothing but its arguments");
  if (!recording_.load()) {
    fn(*this, args...);
    return;
  }
  append_key(key_, what);  // the op (a string literal: one address per op)
  (append_key(key_, args), ...);
  pending_.push_back([this, fn, args...] { fn(*this, args...); });
}

bool CudaBackend::capture_failed(const std::string& what) const {
  if (!capturing_.load() || std::this_thread::get_id() != capture_thread_) return false;
  if (capture_error_.empty()) capture_error_ = what;
  return true;
}

bool CudaBackend::ok(cudaError_t e, const char* call) const {
  if (e == cudaSuccess) return true;
  if (capture_failed(std::string(call) + ": " + cudaGetErrorName(e))) {
    cudaGetLastError();
    return false;
  }
  cudaGetLastError();  // a launch error is not sticky: clear it so the next launch's check is its own
  std::lock_guard<std::mutex> lock(error_mu_);
  if (first_error_.empty()) {
    first_error_ = "CUDA error on " + name() + " in " + call + ": " + cudaGetErrorName(e) + " (" +
                   cudaGetErrorString(e) + ")";
  }
  if (n_errors_ < kMaxLoggedErrors) {
    std::fprintf(stderr, "helios: CUDA error on %s in %s: %s (%s)\n", name().c_str(), call,
                 cudaGetErrorName(e), cudaGetErrorString(e));
  } else if (n_errors_ == kMaxLoggedErrors) {
    std::fprintf(stderr, "helios: further CUDA errors on %s are not logged\n", name().c_str());
  }
  ++n_errors_;
  return false;
}

bool CudaBackend::ok_blas(cublasStatus_t s, const char* call) const {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  if (capture_failed(std::string(call) + ": " + cublasGetStatusString(s))) return false;
  std::lock_guard<std::mutex> lock(error_mu_);
  if (first_error_.empty()) {
    first_error_ = "cuBLAS error on " + name() + " in " + call + ": " + cublasGetStatusString(s);
  }
  if (n_errors_ < kMaxLoggedErrors) {
    std::fprintf(stderr, "helios: cuBLAS error on %s in %s: %s\n", name().c_str(), call,
                 cublasGetStatusString(s));
  }
  ++n_errors_;
  return false;
}

Status CudaBackend::init() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    return failed_precondition(std::string("backend cuda: no CUDA device is visible (cudaGetDeviceCount: ") +
                               (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  if (device_ >= n) {
    return failed_precondition("backend cuda:" + std::to_string(device_) + ": this machine has " +
                               std::to_string(n) + " CUDA device(s), numbered from 0");
  }
  auto fail = [&](const char* call, const std::string& what) {
    return failed_precondition("backend " + name() + ": " + call + " failed: " + what);
  };
  if ((e = cudaSetDevice(device_)) != cudaSuccess) return fail("cudaSetDevice", cudaGetErrorString(e));
  if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess) {
    return fail("cudaStreamCreateWithFlags", cudaGetErrorString(e));
  }
  if ((e = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking)) != cudaSuccess) {
    return fail("cudaStreamCreateWithFlags (copy stream)", cudaGetErrorString(e));
  }
  if ((e = cudaEventCreateWithFlags(&fence_, cudaEventDisableTiming)) != cudaSuccess) {
    return fail("cudaEventCreateWithFlags", cudaGetErrorString(e));
  }
  cublasStatus_t s = cublasCreate(&blas_);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasCreate", cublasGetStatusString(s));
  if ((s = cublasSetStream(blas_, stream_)) != CUBLAS_STATUS_SUCCESS) {
    return fail("cublasSetStream", cublasGetStatusString(s));
  }
  if ((e = cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes)) != cudaSuccess) {
    return fail("cudaMalloc (cuBLAS workspace)", cudaGetErrorString(e));
  }
  if ((s = cublasSetWorkspace(blas_, blas_workspace_, kBlasWorkspaceBytes)) != CUBLAS_STATUS_SUCCESS) {
    return fail("cublasSetWorkspace", cublasGetStatusString(s));
  }
  if ((e = cudaEventCreateWithFlags(&pinned_free_, cudaEventDisableTiming)) != cudaSuccess) {
    return fail("cudaEventCreateWithFlags (step arrays)", cudaGetErrorString(e));
  }
  // No TF32 for F32 matrices: their results stay within float rounding of the CPU's.
  if ((s = cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
    return fail("cublasSetMathMode", cublasGetStatusString(s));
  }
  return ok_status();
}

CudaBackend::~CudaBackend() {
  bind();
  if (stream_) cudaStreamSynchronize(stream_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (auto& [host, s] : staged_) cudaFree(s.device);
  for (void* p : scratch_) cudaFree(p);
  for (void* g : graphs_.clear()) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  for (DeviceInts& slot : step_slots_) cudaFree(slot.device);
  for (void* p : released_) cudaFree(p);
  if (pinned_) cudaFreeHost(pinned_);
  if (pinned_free_) cudaEventDestroy(pinned_free_);
  if (blas_) cublasDestroy(blas_);
  cudaFree(blas_workspace_);
  if (stream_) cudaStreamDestroy(stream_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (fence_) cudaEventDestroy(fence_);
}

// --- memory

float* CudaBackend::alloc(size_t n) {
  bind();
  if (n > SIZE_MAX / sizeof(float)) return nullptr;  // the byte count would wrap around
  void* p = nullptr;
  // At least 256 bytes, so that alloc(0) still gives a unique, non-null pointer.
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(n * sizeof(float), 256));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // out of memory is a normal answer here, not a fault
    return nullptr;
  }
  return ok(e, "cudaMalloc") ? static_cast<float*>(p) : nullptr;
}

void CudaBackend::free(float* p) {
  bind();
  if (recording_.load()) {
    release(p);
    return;
  }
  ok(cudaFree(p), "cudaFree");
}

void CudaBackend::upload(float* dst, const float* src, size_t n) {
  end_graph();
  bind();
  // From pageable memory the call returns once `src` has been staged, so it may be reused.
  ok(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload (cudaMemcpyAsync)");
}

void CudaBackend::download(float* dst, const float* src, size_t n) {
  end_graph();
  bind();
  if (ok(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download (cudaMemcpyAsync)")) {
    ok(cudaStreamSynchronize(stream_), "download (cudaStreamSynchronize)");
  }
}

void CudaBackend::synchronize() {
  end_graph();
  bind();
  ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

float* CudaBackend::alloc_host(size_t n) {
  bind();
  if (n > SIZE_MAX / sizeof(float)) return nullptr;
  void* p = nullptr;
  // Portable: every device of the process copies from it directly (tensor-parallel ranks).
  if (cudaHostAlloc(&p, std::max<size_t>(n * sizeof(float), 256), cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // no pinned memory left is an answer (the caller takes plain memory), not a fault
    return nullptr;
  }
  return static_cast<float*>(p);
}

void CudaBackend::free_host(float* p) {
  bind();
  ok(cudaFreeHost(p), "cudaFreeHost");
}

void CudaBackend::copy_to_host(float* host_dst, const float* src, size_t n) {
  bind();
  ok(cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, copy_stream_),
     "copy_to_host (cudaMemcpyAsync)");
}

void CudaBackend::copy_from_host(float* dst, const float* host_src, size_t n) {
  bind();
  ok(cudaMemcpyAsync(dst, host_src, n * sizeof(float), cudaMemcpyHostToDevice, copy_stream_),
     "copy_from_host (cudaMemcpyAsync)");
}

void CudaBackend::copy_fence() {
  bind();
  std::lock_guard<std::mutex> lock(fence_mu_);
  if (ok(cudaEventRecord(fence_, stream_), "copy_fence (cudaEventRecord)")) {
    ok(cudaStreamWaitEvent(copy_stream_, fence_, 0), "copy_fence (cudaStreamWaitEvent)");
  }
}

void CudaBackend::copy_wait() {
  bind();
  ok(cudaStreamSynchronize(copy_stream_), "copy_wait (cudaStreamSynchronize)");
}

size_t CudaBackend::free_device_bytes() const {
  bind();
  size_t free_bytes = 0, total = 0;
  return ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo") ? free_bytes : 0;
}

const int32_t* CudaBackend::stage(const int32_t* host, size_t n) {
  if (recording_.load()) return stage_for_step(host, n);
  StagedInts& s = staged_[host];
  if (s.device && s.shadow.size() == n && std::memcmp(s.shadow.data(), host, n * sizeof(int32_t)) == 0) {
    return s.device;
  }
  if (n > s.capacity || !s.device) {
    ok(cudaFree(s.device), "cudaFree (index array)");
    s.device = nullptr;
    s.capacity = std::max<size_t>(n, 256);
    void* p = nullptr;
    if (!ok(cudaMalloc(&p, s.capacity * sizeof(int32_t)), "cudaMalloc (index array)")) {
      staged_.erase(host);
      return nullptr;
    }
    s.device = static_cast<int32_t*>(p);
  }
  s.shadow.assign(host, host + n);
  if (!ok(cudaMemcpyAsync(s.device, s.shadow.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (index array)")) {
    s.shadow.clear();
    return nullptr;
  }
  return s.device;
}

void CudaBackend::trim_staged() {
  if (recording_.load() || staged_.size() <= kMaxStagedArrays) return;
  // cudaFree waits for the launches that read them.
  for (auto& [host, s] : staged_) ok(cudaFree(s.device), "cudaFree (index array)");
  staged_.clear();
}

void* CudaBackend::scratch(Scratch which, size_t bytes) {
  return ok(grow_scratch(which, bytes), "cudaMalloc (scratch)") ? scratch_[which] : nullptr;
}

cudaError_t CudaBackend::grow_scratch(Scratch which, size_t bytes) {
  if (bytes <= scratch_bytes_[which] && scratch_[which]) return cudaSuccess;
  if (recording_.load()) {
    release(scratch_[which]);
  } else {
    ok(cudaFree(scratch_[which]), "cudaFree (scratch)");  // waits for the work that may still use it
  }
  scratch_[which] = nullptr;
  scratch_bytes_[which] = 0;
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) return e;
  scratch_[which] = p;
  scratch_bytes_[which] = bytes;
  return cudaSuccess;
}

// What matmul (quantized weights: up to gemv_max_rows activation rows in 8 bits; cuBLAS for more
// rows: the activations in 16 bits, a quantized matrix's rows dequantized a slice at a time),
// attention's context splits, exit_stats and sample_rows (its sort, and its rows with up to
// kReservedAdjustPerRow adjustments each) take for a pass.
Status CudaBackend::reserve_scratch(const PassShape& pass) {
  bind();
  const int32_t n_tokens = pass.n_tokens;
  if (n_tokens <= 0) return ok_status();
  size_t half_x = 0, half_w = 0, q8_x = 0;
  for (const WeightMatrix& w : pass.matrices) {
    if (!w.data || w.type == TensorType::kF32) continue;
    if (quantized_type(w.type)) {  // a pass's matmuls may take fewer rows than its tokens
      q8_x = std::max(q8_x, kernels::matmul_quant_q8_workspace_bytes(std::min(n_tokens, gemv_max_rows(w)), w.n_in));
    }
    if (n_tokens <= gemv_max_rows(w)) continue;
    half_x = std::max(half_x, half_rows_bytes(n_tokens, w));
    if (quantized_type(w.type)) half_w = std::max(half_w, dequant_slice_bytes(w));
  }
  const struct {
    Scratch which;
    size_t bytes;
    const char* what;
  } needs[] = {
      {kScratchHalfX, half_x, "activations in 16 bits for cuBLAS"},
      {kScratchQ8X, q8_x, "activations in 8 bits for quantized weights"},
      {kScratchHalfW, half_w, "quantized weights dequantized for cuBLAS"},
      {kScratchAttention,
       sizeof(float) * static_cast<size_t>(kernels::paged_attention_workspace_bound(pass.n_heads, pass.head_dim)),
       "attention's context splits"},
      {kScratchStats, stats_bytes(n_tokens), "exit statistics"},
      {kScratchSample, kernels::sample_rows_workspace_bytes(std::min(n_tokens, kSampleGroup), pass.n_vocab),
       "the sampling sort"},
      {kScratchSampleIo, sample_io_layout(n_tokens, kReservedAdjustPerRow * static_cast<size_t>(n_tokens)).total, "sampling's rows"},
  };
  for (const auto& need : needs) {
    if (need.bytes == 0) continue;
    if (const cudaError_t e = grow_scratch(need.which, need.bytes); e != cudaSuccess) {
      cudaGetLastError();  // an allocation that failed leaves nothing behind
      return resource_exhausted(name() + ": no room for the " + std::to_string(need.bytes >> 20) + " MiB of " +
                                need.what + " a " + std::to_string(n_tokens) + "-token pass needs (" +
                                cudaGetErrorName(e) + "); lower engine.max_batched_tokens, or load a smaller model");
    }
  }
  return ok_status();
}

// --- ops

void CudaBackend::embedding(const int32_t* tokens, int32_t n_tokens, const float* table,
                            int32_t dim, float* out) {
  bind();
  trim_staged();
  const int32_t* d_tokens = stage(tokens, n_tokens);
  if (!d_tokens) return;
  launch("embedding", [](CudaBackend& b, const int32_t* t, int32_t n, const float* table, int32_t dim, float* out) {
    b.ok_launch(kernels::launch_embedding(t, n, table, dim, out, b.stream_), "launch_embedding");
  }, d_tokens, n_tokens, table, dim, out);
}

void CudaBackend::rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps,
                          float* out) {
  bind();
  launch("rmsnorm", [](CudaBackend& b, const float* x, const float* w, int32_t n_rows, int32_t dim, float eps, float* out) {
    b.ok_launch(kernels::launch_rmsnorm(x, w, n_rows, dim, eps, out, b.stream_), "launch_rmsnorm");
  }, x, w, n_rows, dim, eps, out);
}

void CudaBackend::add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows,
                              int32_t dim, float eps, float* out) {
  bind();
  launch("add_rmsnorm", [](CudaBackend& b, float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                           float eps, float* out) {
    b.ok_launch(kernels::launch_add_rmsnorm(x, y, weight, n_rows, dim, eps, out, b.stream_), "launch_add_rmsnorm");
  }, x, y, weight, n_rows, dim, eps, out);
}

void CudaBackend::matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) {
  bind();
  if (n_rows <= 0) return;
  // Row-major y[n_rows, n_out] = x[n_rows, n_in] · W[n_out, n_in]^T is, column-major,
  // y^T = W^T' x^T: cuBLAS sees W as an n_in × n_out matrix and transposes it.
  if (w.type == TensorType::kF32) {
    launch("sgemm", [](CudaBackend& b, const float* x, const WeightMatrix& w, int32_t n_rows, float* y) {
      const float one = 1.0f, zero = 0.0f;
      b.ok_blas(cublasSgemm(b.blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.n_out, n_rows, w.n_in, &one,
                            static_cast<const float*>(w.data), w.n_in, x, w.n_in, &zero, y, w.n_out),
                "cublasSgemm");
    }, x, w, n_rows, y);
    return;
  }
  const bool quantized = quantized_type(w.type), bf16 = w.type == TensorType::kBF16;
  if (w.type != TensorType::kF16 && !bf16 && !quantized) {
    ok(cudaErrorInvalidValue, "matmul (weight type not uploaded as F32, F16, BF16 or a quantized type)");
    return;
  }
  if (quantized && n_rows <= gemv_max_rows(w)) {
    if (const void* q8 = round_q8(x, w, n_rows)) {
      gemv_q8(q8, w.type, n_rows, w.n_in, kernels::GemvProducts::of(w.data, w.n_out, y));
    }
    return;
  }
  if (n_rows <= kGemvMaxRows) {
    gemv_16bit(x, w.type, n_rows, w.n_in, kernels::GemvProducts::of(w.data, w.n_out, y));
    return;
  }
  auto* xh = static_cast<uint16_t*>(scratch(kScratchHalfX, half_rows_bytes(n_rows, w)));
  if (!xh) return;
  if (bf16) {  // bfloat16 weights and activations, f32 sums
    launch("gemm_bf16", [](CudaBackend& b, const float* x, const WeightMatrix& w, int32_t n_rows, float* y,
                           uint16_t* xb) {
      const float one = 1.0f, zero = 0.0f;
      if (!b.ok_launch(kernels::launch_f32_to_bf16(x, static_cast<int64_t>(n_rows) * w.n_in, xb, b.stream_),
                       "launch_f32_to_bf16")) {
        return;
      }
      b.ok_blas(cublasGemmEx(b.blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.n_out, n_rows, w.n_in, &one, w.data, CUDA_R_16BF,
                             w.n_in, xb, CUDA_R_16BF, w.n_in, &zero, y, CUDA_R_32F, w.n_out, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx (BF16)");
    }, x, w, n_rows, y, xh);
    return;
  }
  // A quantized matrix is dequantized kDequantRows rows at a time into wh.
  uint16_t* wh = nullptr;
  if (quantized) {
    wh = static_cast<uint16_t*>(scratch(kScratchHalfW, dequant_slice_bytes(w)));
    if (!wh) return;
  }
  launch("gemm_f16", [](CudaBackend& b, const float* x, const WeightMatrix& w, int32_t n_rows, float* y, uint16_t* xh,
                        uint16_t* wh) {
    if (!b.ok_launch(kernels::launch_f32_to_f16(x, static_cast<int64_t>(n_rows) * w.n_in, xh, b.stream_),
                     "launch_f32_to_f16")) {
      return;
    }
    // y[:, o0:o0+n] = x · W[o0:o0+n]^T: column-major, rows o0.. of y^T, whose leading dimension is n_out.
    auto gemm = [&](const void* weights, int32_t o0, int32_t n) {
      const float one = 1.0f, zero = 0.0f;
      return b.ok_blas(cublasGemmEx(b.blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, n_rows, w.n_in, &one, weights, CUDA_R_16F,
                                    w.n_in, xh, CUDA_R_16F, w.n_in, &zero, y + o0, CUDA_R_32F, w.n_out,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx (F16)");
    };
    if (!wh) {
      gemm(w.data, 0, w.n_out);
      return;
    }
    const int64_t row_bytes = tensor_row_bytes(w.type, w.n_in);
    const int32_t slice = std::min(kDequantRows, w.n_out);
    for (int32_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int32_t n = std::min(slice, w.n_out - o0);
      const void* rows = static_cast<const uint8_t*>(w.data) + static_cast<int64_t>(o0) * row_bytes;
      if (!b.ok_launch(kernels::launch_dequantize_f16(static_cast<uint32_t>(w.type), rows, n, w.n_in, wh, b.stream_),
                       "launch_dequantize_f16") ||
          !gemm(wh, o0, n)) {
        return;
      }
    }
  }, x, w, n_rows, y, xh, wh);
}

void* CudaBackend::round_q8(const float* x, const WeightMatrix& w, int32_t n_rows) {
  const size_t bytes = kernels::matmul_quant_q8_workspace_bytes(n_rows, w.n_in);
  void* q8 = scratch(kScratchQ8X, bytes);
  if (!q8) return nullptr;
  launch("quantize_q8", [](CudaBackend& b, const float* x, TensorType type, int32_t n_rows, int32_t n_in, void* q8,
                           size_t bytes) {
    b.ok_launch(kernels::launch_quantize_q8(static_cast<uint32_t>(type), x, n_rows, n_in, q8, bytes, b.stream_),
                "launch_quantize_q8");
  }, x, w.type, n_rows, w.n_in, q8, bytes);
  return q8;
}

void CudaBackend::gemv_q8(const void* q8, TensorType type, int32_t n_rows, int32_t n_in,
                          const kernels::GemvProducts& products) {
  launch("gemv_q8", [](CudaBackend& b, const void* q8, TensorType type, int32_t n_rows, int32_t n_in,
                       kernels::GemvProducts products) {
    b.ok_launch(kernels::launch_matmul_q8_products(static_cast<uint32_t>(type), q8, n_rows, n_in, products, b.stream_),
                "launch_matmul_q8_products");
  }, q8, type, n_rows, n_in, products);
}

void CudaBackend::gemv_16bit(const float* x, TensorType type, int32_t n_rows, int32_t n_in,
                             const kernels::GemvProducts& products) {
  launch("gemv", [](CudaBackend& b, const float* x, TensorType type, int32_t n_rows, int32_t n_in,
                    kernels::GemvProducts products) {
    if (type == TensorType::kBF16) {
      b.ok_launch(kernels::launch_matmul_bf16_products(x, n_rows, n_in, products, b.stream_),
                  "launch_matmul_bf16_products");
    } else {
      b.ok_launch(kernels::launch_matmul_f16_products(x, n_rows, n_in, products, b.stream_),
                  "launch_matmul_f16_products");
    }
  }, x, type, n_rows, n_in, products);
}

// The first output left, with the others of its type, width and row count (up to a launch's
// kMaxGemvProducts), taken out of `left` as one launch's products.
kernels::GemvProducts take_launch(std::vector<const Backend::MatmulOutput*>& left) {
  const Backend::MatmulOutput first = *left.front();
  kernels::GemvProducts group;
  std::erase_if(left, [&](const Backend::MatmulOutput* o) {
    if (group.n == kernels::kMaxGemvProducts || o->w->type != first.w->type || o->w->n_in != first.w->n_in ||
        o->n_rows != first.n_rows) {
      return false;
    }
    group.at[group.n++] = {o->w->data, o->w->n_out, o->y, o->bias};
    return true;
  });
  return group;
}

// The outputs the 8-bit kernel takes that round x as the first of them does share one rounding,
// of the most rows any of them reads; they run first, since any other quantized product rounds
// its own input into the same scratch. Outputs on a matrix-vector kernel (those, and F16/BF16
// ones of up to kGemvMaxRows rows) of one type and row count share a launch (Q, K and V, or gate
// and up, of one type in one), which adds their biases as it writes. The others take matmul,
// then one add_rows for a bias.
CudaBackend::MatmulPlan CudaBackend::plan_matmuls(std::initializer_list<MatmulOutput> outputs) const {
  MatmulPlan plan;
  for (const MatmulOutput& o : outputs) {
    if (o.n_rows <= 0) continue;
    const WeightMatrix& w = *o.w;
    const bool on_8_bits = quantized_type(w.type) && o.n_rows <= gemv_max_rows(w) &&
                           (!plan.lead || (w.n_in == plan.lead->w->n_in &&
                                           kernels::q8_rounds_alike(static_cast<uint32_t>(plan.lead->w->type),
                                                                    static_cast<uint32_t>(w.type))));
    if (on_8_bits) {
      if (!plan.lead) plan.lead = &o;
      plan.rounded_rows = std::max(plan.rounded_rows, o.n_rows);
      plan.rounded.push_back(&o);
    } else if (o.n_rows <= kGemvMaxRows && (w.type == TensorType::kF16 || w.type == TensorType::kBF16)) {
      plan.halves.push_back(&o);
    } else {
      plan.others.push_back(&o);
    }
  }
  return plan;
}

void CudaBackend::run_matmuls(const float* x, MatmulPlan plan, const void* q8) {
  while (q8 && !plan.rounded.empty()) {
    const MatmulOutput& first = *plan.rounded.front();
    gemv_q8(q8, first.w->type, first.n_rows, first.w->n_in, take_launch(plan.rounded));
  }
  while (!plan.halves.empty()) {
    const MatmulOutput& first = *plan.halves.front();
    gemv_16bit(x, first.w->type, first.n_rows, first.w->n_in, take_launch(plan.halves));
  }
  for (const MatmulOutput* o : plan.others) {
    matmul(x, *o->w, o->n_rows, o->y);
    if (o->bias) add_rows(o->y, o->bias, o->n_rows, o->w->n_out);
  }
}

void CudaBackend::matmuls(const float* x, std::initializer_list<MatmulOutput> outputs) {
  bind();
  MatmulPlan plan = plan_matmuls(outputs);
  const void* q8 = plan.lead ? round_q8(x, *plan.lead->w, plan.rounded_rows) : nullptr;
  run_matmuls(x, std::move(plan), q8);
}

// The norm rounds its rows for the 8-bit products when they read exactly its rows; else (exited
// tokens' rows beside them, no quantized product) the two in turn.
void CudaBackend::norm_matmuls(float* x, const float* residual, const float* weight, int32_t n_rows, int32_t dim,
                               float eps, float* out, std::initializer_list<MatmulOutput> outputs) {
  bind();
  MatmulPlan plan = plan_matmuls(outputs);
  if (!plan.lead || plan.rounded_rows != n_rows || plan.lead->w->n_in != dim) {
    Backend::norm_matmuls(x, residual, weight, n_rows, dim, eps, out, outputs);
    return;
  }
  const size_t bytes = kernels::matmul_quant_q8_workspace_bytes(n_rows, dim);
  void* q8 = scratch(kScratchQ8X, bytes);
  if (!q8) return;
  launch("norm_q8", [](CudaBackend& b, float* x, const float* residual, const float* weight, int32_t n_rows,
                       int32_t dim, float eps, float* out, TensorType type, void* q8, size_t bytes) {
    const auto t = static_cast<uint32_t>(type);
    if (residual) {
      b.ok_launch(kernels::launch_add_rmsnorm_q8(t, x, residual, weight, n_rows, dim, eps, out, q8, bytes, b.stream_),
                  "launch_add_rmsnorm_q8");
    } else {
      b.ok_launch(kernels::launch_rmsnorm_q8(t, x, weight, n_rows, dim, eps, out, q8, bytes, b.stream_),
                  "launch_rmsnorm_q8");
    }
  }, x, residual, weight, n_rows, dim, eps, out, plan.lead->w->type, q8, bytes);
  run_matmuls(out, std::move(plan), q8);
}

// On a matrix-vector kernel, the product is added to the residual as it is written; on the 8-bit
// one, SwiGLU rounds its output for it as it writes it too.
void CudaBackend::swiglu_matmul(const float* gate, const float* up, int32_t n_rows, float* out, const WeightMatrix& w,
                                float* y, float* residual) {
  bind();
  if (n_rows <= 0) return;
  kernels::GemvProducts product = kernels::GemvProducts::of(w.data, w.n_out, residual ? residual : y);
  product.at[0].accumulate = residual != nullptr;
  if (quantized_type(w.type) && n_rows <= gemv_max_rows(w)) {
    const size_t bytes = kernels::matmul_quant_q8_workspace_bytes(n_rows, w.n_in);
    void* q8 = scratch(kScratchQ8X, bytes);
    if (!q8) return;
    launch("swiglu_q8", [](CudaBackend& b, const float* gate, const float* up, int32_t n_rows, float* out,
                           TensorType type, int32_t n_ff, void* q8, size_t bytes) {
      b.ok_launch(kernels::launch_swiglu_q8(static_cast<uint32_t>(type), gate, up, n_rows, n_ff, out, q8, bytes,
                                            b.stream_),
                  "launch_swiglu_q8");
    }, gate, up, n_rows, out, w.type, w.n_in, q8, bytes);
    gemv_q8(q8, w.type, n_rows, w.n_in, product);
    return;
  }
  if (n_rows <= kGemvMaxRows && (w.type == TensorType::kF16 || w.type == TensorType::kBF16)) {
    swiglu(gate, up, static_cast<int64_t>(n_rows) * w.n_in, out);
    gemv_16bit(out, w.type, n_rows, w.n_in, product);
    return;
  }
  Backend::swiglu_matmul(gate, up, n_rows, out, w, y, residual);
}

void CudaBackend::rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                       const kernels::RopeParams& rope) {
  bind();
  trim_staged();
  const int32_t* d_pos = stage(positions, n_tokens);
  if (!d_pos) return;
  launch("rope", [](CudaBackend& b, float* x, const int32_t* pos, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                    kernels::RopeParams rope) {
    b.ok_launch(kernels::launch_rope(x, pos, n_tokens, n_heads, head_dim, rope, b.stream_), "launch_rope");
  }, x, d_pos, n_tokens, n_heads, head_dim, rope);
}

void CudaBackend::kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                           const kernels::PagedKV& cache) {
  bind();
  trim_staged();
  const int32_t* d_slots = stage(slots, n_tokens);
  if (!d_slots) return;
  launch("kv_write", [](CudaBackend& b, const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                        const kernels::PagedKV& cache) {
    b.ok_launch(kernels::launch_kv_write(k, v, slots, n_tokens, cache, b.stream_), "launch_kv_write");
  }, k, v, d_slots, n_tokens, cache);
}

void CudaBackend::rope_kv_write(float* q, const int32_t* q_positions, int32_t n_q, int32_t n_heads, float* k,
                                const float* v, const int32_t* kv_positions, const int32_t* slots, int32_t n_kv,
                                const kernels::RopeParams& rope, const kernels::PagedKV& cache) {
  bind();
  n_q = std::max(n_q, 0);
  n_kv = std::max(n_kv, 0);
  if (n_q == 0 && n_kv == 0) return;
  trim_staged();
  const int32_t* d_q_pos = n_q > 0 ? stage(q_positions, n_q) : nullptr;
  const int32_t* d_kv_pos = n_kv > 0 ? stage(kv_positions, n_kv) : nullptr;
  const int32_t* d_slots = n_kv > 0 ? stage(slots, n_kv) : nullptr;
  if ((n_q > 0 && !d_q_pos) || (n_kv > 0 && (!d_kv_pos || !d_slots))) return;
  launch("rope_kv_write", [](CudaBackend& b, float* q, const int32_t* q_pos, int32_t n_q, int32_t n_heads, float* k,
                             const float* v, const int32_t* kv_pos, const int32_t* slots, int32_t n_kv,
                             kernels::RopeParams rope, const kernels::PagedKV& cache) {
    b.ok_launch(kernels::launch_rope_kv_write(q, q_pos, n_q, n_heads, k, v, kv_pos, slots, n_kv, rope, cache, b.stream_),
                "launch_rope_kv_write");
  }, q, d_q_pos, n_q, n_heads, k, v, d_kv_pos, d_slots, n_kv, rope, cache);
}

void CudaBackend::paged_attention(const float* q, const kernels::PagedKV& cache,
                                  const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                                  float* out) {
  bind();
  if (plan.n_tokens <= 0) return;
  trim_staged();
  int32_t n_seqs = 0;
  for (int32_t t = 0; t < plan.n_tokens; ++t) n_seqs = std::max(n_seqs, plan.token_seq[t] + 1);
  kernels::AttentionTiles tiles = kernels::attention_tiles(
      plan, kernels::attention_tile_tokens(n_heads, cache.n_kv_heads, cache.head_dim), &tile_first_);
  tiles.span = coarse_span(tiles.span);
  kernels::AttentionPlan d_plan = plan;
  d_plan.token_seq = stage(plan.token_seq, plan.n_tokens);
  d_plan.positions = stage(plan.positions, plan.n_tokens);
  d_plan.block_tables = stage(plan.block_tables, static_cast<size_t>(n_seqs) * plan.max_blocks_per_seq);
  tiles.first = stage(tile_first_.data(), tile_first_.size());
  if (!d_plan.token_seq || !d_plan.positions || !d_plan.block_tables || !tiles.first) return;
  const int64_t ws_floats = kernels::paged_attention_workspace_floats(
      plan.n_tokens, n_heads, cache.n_kv_heads, cache.head_dim, tiles.span);
  float* ws = nullptr;
  if (ws_floats > 0) {
    ws = static_cast<float*>(scratch(kScratchAttention, ws_floats * sizeof(float)));
    if (!ws) return;
  }
  launch("paged_attention", [](CudaBackend& b, const float* q, const kernels::PagedKV& cache,
                               const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                               const kernels::AttentionTiles& tiles, float* ws, float* out) {
    b.ok_launch(kernels::launch_paged_attention(q, cache, plan, n_heads, scale, tiles, ws, out, b.stream_),
                "launch_paged_attention");
  }, q, cache, d_plan, n_heads, scale, tiles, ws, out);
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  bind();
  launch("swiglu", [](CudaBackend& b, const float* gate, const float* up, int64_t n, float* out) {
    b.ok_launch(kernels::launch_swiglu(gate, up, n, out, b.stream_), "launch_swiglu");
  }, gate, up, n, out);
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
  bind();
  launch("add", [](CudaBackend& b, float* x, const float* y, int64_t n) {
    b.ok_launch(kernels::launch_add(x, y, n, b.stream_), "launch_add");
  }, x, y, n);
}

void CudaBackend::add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim) {
  bind();
  launch("add_rows", [](CudaBackend& b, float* rows, const float* v, int32_t n_rows, int32_t dim) {
    b.ok_launch(kernels::launch_add_rows(rows, v, n_rows, dim, b.stream_), "launch_add_rows");
  }, rows, v, n_rows, dim);
}

// [top1 | top1_prob | margin | entropy], n_rows each, 4 bytes per value, left on the device.
const uint8_t* CudaBackend::enqueue_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab) {
  auto* d = static_cast<uint8_t*>(scratch(kScratchStats, stats_bytes(n_rows)));
  if (!d) return nullptr;
  const size_t n = static_cast<size_t>(n_rows);
  auto* d_top1 = reinterpret_cast<int32_t*>(d);
  auto* d_prob = reinterpret_cast<float*>(d + 4 * n);
  auto* d_margin = reinterpret_cast<float*>(d + 8 * n);
  auto* d_entropy = reinterpret_cast<float*>(d + 12 * n);
  return ok_launch(kernels::launch_exit_stats(logits, n_rows, n_vocab, d_top1, d_prob, d_margin, d_entropy, stream_),
                   "launch_exit_stats")
             ? d
             : nullptr;
}

// [token | logprob], n_rows each, left on the device.
const uint8_t* CudaBackend::enqueue_sample(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows,
                                           int32_t n_rows, const kernels::LogitAdjust* adjust, int32_t n_adjust) {
  // Rows and adjustments go up. Rows go through in groups so the sort's workspace stays bounded
  // (about 24 bytes per logit).
  const size_t rows_bytes = sizeof(kernels::SampleRow) * n_rows, adjust_bytes = sizeof(kernels::LogitAdjust) * n_adjust;
  const SampleIoLayout layout = sample_io_layout(n_rows, n_adjust);
  const size_t adjust_at = layout.adjust_at, out_at = layout.out_at;
  // Penalties bring a row a token or so more each step: past the reservation the buffer grows to
  // the next power of two, so not every step frees and allocates (each cudaFree waits for the pass).
  const size_t io_bytes = layout.total <= scratch_bytes_[kScratchSampleIo] ? layout.total : std::bit_ceil(layout.total);
  auto* io = static_cast<uint8_t*>(scratch(kScratchSampleIo, io_bytes));
  const int32_t group = std::min(n_rows, kSampleGroup);
  const size_t ws_bytes = kernels::sample_rows_workspace_bytes(group, n_vocab);
  void* ws = scratch(kScratchSample, ws_bytes);
  if (!io || !ws) return nullptr;
  auto* d_rows = reinterpret_cast<kernels::SampleRow*>(io);
  auto* d_adjust = reinterpret_cast<kernels::LogitAdjust*>(io + adjust_at);
  auto* d_token = reinterpret_cast<int32_t*>(io + out_at);
  auto* d_logprob = reinterpret_cast<float*>(io + out_at + 4 * static_cast<size_t>(n_rows));
  if (!ok(cudaMemcpyAsync(d_rows, rows, rows_bytes, cudaMemcpyHostToDevice, stream_), "sample_rows (rows)")) return nullptr;
  if (n_adjust > 0 &&
      !ok(cudaMemcpyAsync(d_adjust, adjust, adjust_bytes, cudaMemcpyHostToDevice, stream_), "sample_rows (adjust)")) {
    return nullptr;
  }
  for (int32_t first = 0; first < n_rows; first += kSampleGroup) {
    const int32_t n = std::min(kSampleGroup, n_rows - first);
    const bool all_greedy = std::all_of(rows + first, rows + first + n, [](const kernels::SampleRow& r) {
      return r.temperature == 0.0f;
    });
    if (!ok_launch(kernels::launch_sample_rows(logits, n_vocab, d_rows + first, n, d_adjust, ws, ws_bytes, d_token + first,
                                               d_logprob + first, stream_, all_greedy),
                   "launch_sample_rows")) {
      return nullptr;
    }
  }
  return io + out_at;
}

// Each (device, bytes) into `host` one after another, then one wait.
bool CudaBackend::download_results(std::initializer_list<std::pair<const uint8_t*, size_t>> parts,
                                   std::vector<uint8_t>& host) {
  size_t total = 0;
  for (const auto& [d, bytes] : parts) total += bytes;
  host.resize(total);
  size_t at = 0;
  for (const auto& [d, bytes] : parts) {
    if (!ok(cudaMemcpyAsync(host.data() + at, d, bytes, cudaMemcpyDeviceToHost, stream_), "results (cudaMemcpyAsync)")) {
      return false;
    }
    at += bytes;
  }
  return ok(cudaStreamSynchronize(stream_), "results (cudaStreamSynchronize)");
}

void unpack_stats(const uint8_t* host, size_t n, int32_t* top1, float* top1_prob, float* margin, float* entropy) {
  std::memcpy(top1, host, 4 * n);
  std::memcpy(top1_prob, host + 4 * n, 4 * n);
  std::memcpy(margin, host + 8 * n, 4 * n);
  std::memcpy(entropy, host + 12 * n, 4 * n);
}

void unpack_draws(const uint8_t* host, size_t n, int32_t* token, float* logprob) {
  std::memcpy(token, host, 4 * n);
  std::memcpy(logprob, host + 4 * n, 4 * n);
}

void CudaBackend::exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                             float* top1_prob, float* margin, float* entropy) {
  end_graph();
  bind();
  if (n_rows <= 0) return;
  const size_t n = static_cast<size_t>(n_rows);
  const uint8_t* d = enqueue_exit_stats(logits, n_rows, n_vocab);
  std::vector<uint8_t> host;
  if (d && download_results({{d, 16 * n}}, host)) unpack_stats(host.data(), n, top1, top1_prob, margin, entropy);
}

void CudaBackend::sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                              const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token, float* logprob) {
  end_graph();
  bind();
  if (n_rows <= 0) return;
  const size_t n = static_cast<size_t>(n_rows);
  const uint8_t* d = enqueue_sample(logits, n_vocab, rows, n_rows, adjust, n_adjust);
  std::vector<uint8_t> host;
  if (d && download_results({{d, 8 * n}}, host)) unpack_draws(host.data(), n, token, logprob);
}

void CudaBackend::exit_stats_and_sample(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                                        float* top1_prob, float* margin, float* entropy,
                                        const kernels::SampleRow* draws, int32_t n_draws,
                                        const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token,
                                        float* logprob) {
  end_graph();
  bind();
  if (n_rows <= 0) {
    if (n_draws > 0) sample_rows(logits, n_vocab, draws, n_draws, adjust, n_adjust, token, logprob);
    return;
  }
  if (n_draws <= 0) {
    exit_stats(logits, n_rows, n_vocab, top1, top1_prob, margin, entropy);
    return;
  }
  const size_t n = static_cast<size_t>(n_rows), nd = static_cast<size_t>(n_draws);
  const uint8_t* stats = enqueue_exit_stats(logits, n_rows, n_vocab);
  const uint8_t* drawn = stats ? enqueue_sample(logits, n_vocab, draws, n_draws, adjust, n_adjust) : nullptr;
  std::vector<uint8_t> host;
  if (!drawn || !download_results({{stats, 16 * n}, {drawn, 8 * nd}}, host)) return;
  unpack_stats(host.data(), n, top1, top1_prob, margin, entropy);
  unpack_draws(host.data() + 16 * n, nd, token, logprob);
}

// --- step graphs

void CudaBackend::begin_graph() {
  if (!graphs_on_ || recording_.load()) return;
  bind();
  // The last step's arrays may still be on their way up out of pinned_.
  if (pinned_busy_ && !ok(cudaEventSynchronize(pinned_free_), "begin_graph (cudaEventSynchronize)")) return;
  pinned_busy_ = false;
  key_.clear();
  append_key(key_, kernels::chained_launches());  // a graph holds its launches as they went out
  pending_.clear();
  step_copies_.clear();
  pinned_used_ = 0;
  recording_ = true;
}

const int32_t* CudaBackend::stage_for_step(const int32_t* host, size_t n) {
  for (const StepCopy& c : step_copies_) {  // one array sent again unchanged (every layer's positions)
    if (c.host == host && c.n == n && std::memcmp(pinned_ + c.offset, host, n * sizeof(int32_t)) == 0) return c.device;
  }
  const size_t i = step_copies_.size();
  if (i == step_slots_.size()) step_slots_.emplace_back();
  DeviceInts& slot = step_slots_[i];
  if (slot.capacity < n) {
    release(slot.device);
    slot = {};
    const size_t capacity = std::bit_ceil(std::max<size_t>(n, 256));
    void* p = nullptr;
    if (!ok(cudaMalloc(&p, capacity * sizeof(int32_t)), "cudaMalloc (step index array)")) return nullptr;
    slot = {static_cast<int32_t*>(p), capacity};
  }
  if (pinned_used_ + n > pinned_capacity_) {  // nothing reads pinned_ until the step ends (begin_graph waited)
    const size_t capacity = std::bit_ceil(std::max<size_t>(pinned_used_ + n, 4096));
    void* p = nullptr;
    if (!ok(cudaHostAlloc(&p, capacity * sizeof(int32_t), cudaHostAllocDefault), "cudaHostAlloc (step index arrays)")) {
      return nullptr;
    }
    if (pinned_) {
      std::memcpy(p, pinned_, pinned_used_ * sizeof(int32_t));
      cudaFreeHost(pinned_);
    }
    pinned_ = static_cast<int32_t*>(p);
    pinned_capacity_ = capacity;
  }
  std::memcpy(pinned_ + pinned_used_, host, n * sizeof(int32_t));
  step_copies_.push_back({host, pinned_used_, n, slot.device});
  pinned_used_ += n;
  return slot.device;
}

void CudaBackend::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(released_mu_);
  released_.push_back(p);
}

void CudaBackend::end_graph() {
  if (!recording_.load()) return;
  bind();
  recording_ = false;
  if (!pending_.empty()) {
    for (const StepCopy& c : step_copies_) {
      ok(cudaMemcpyAsync(c.device, pinned_ + c.offset, c.n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
         "step graph (cudaMemcpyAsync, index arrays)");
    }
    if (!step_copies_.empty()) pinned_busy_ = ok(cudaEventRecord(pinned_free_, stream_), "step graph (cudaEventRecord)");
    const StepGraphCache::Decision d = graphs_.decide(key_);
    if (d.action == StepGraphCache::Action::kReplay) {
      if (ok(cudaGraphLaunch(static_cast<cudaGraphExec_t>(d.graph), stream_), "cudaGraphLaunch")) ++counters_.replayed;
    } else if (d.action != StepGraphCache::Action::kCapture || !capture_step()) {  // a capture counts itself
      for (auto& run : pending_) run();
      ++counters_.run;
    }
  }
  pending_.clear();
  std::vector<void*> released;
  {
    std::lock_guard<std::mutex> lock(released_mu_);
    released.swap(released_);
  }
  for (void* p : released) ok(cudaFree(p), "cudaFree");  // waits for the step that named it
}

bool CudaBackend::capture_step() {
  // No copy fence may record on the stream from another thread while it captures.
  std::lock_guard<std::mutex> lock(fence_mu_);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  capture_error_.clear();
  capture_thread_ = std::this_thread::get_id();
  capturing_ = true;
  cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    for (auto& run : pending_) run();
    e = cudaStreamEndCapture(stream_, &graph);
  }
  capturing_ = false;
  if (e == cudaSuccess && capture_error_.empty()) e = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (e != cudaSuccess || !capture_error_.empty()) {
    cudaGetLastError();
    std::fprintf(stderr, "helios: CUDA graphs off on %s: a step could not be captured (%s); steps run op by op\n",
                 name().c_str(), capture_error_.empty() ? cudaGetErrorName(e) : capture_error_.c_str());
    if (exec) cudaGraphExecDestroy(exec);
    graphs_on_ = false;
    return false;
  }
  if (void* old = graphs_.store(key_, exec)) {
    ok(cudaStreamSynchronize(stream_), "step graph (cudaStreamSynchronize)");
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(old));
  }
  if (ok(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch")) ++counters_.captured;
  return true;
}

void CudaBackend::set_graphs(bool on) {
  end_graph();
  bind();
  graphs_on_ = on;
  if (on) return;
  ok(cudaStreamSynchronize(stream_), "set_graphs (cudaStreamSynchronize)");
  for (void* g : graphs_.clear()) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  auto backend = std::make_unique<CudaBackend>(device);
  HELIOS_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

// Quantized matrices: kGemvMaxRows a launch, each launch reading the blocks once. Past the limit,
// cuBLAS on f16 weights dequantized a slice at a time costs less: it reads the blocks once but
// writes and reads back 4 bytes per weight besides. The two read about the same bytes where
// ⌈n/8⌉·b = b + 4, b the blocks' bytes per value. A bytes model; the GPU benchmark's batch sweep
// is where it is checked.
int32_t cuda_gemv_max_rows(TensorType type, int32_t n_in) {
  if (type == TensorType::kF16 || type == TensorType::kBF16) return kGemvMaxRows;
  const auto blocks = tensor_type_traits(static_cast<uint32_t>(type));
  if (!quantized_type(type) || !blocks || n_in <= 0 || n_in % blocks->block_elems != 0) return 0;
  const double per_value = static_cast<double>(blocks->block_bytes) / static_cast<double>(blocks->block_elems);
  return kGemvMaxRows * static_cast<int32_t>(1.0 + 4.0 / per_value);
}

}  // namespace helios
