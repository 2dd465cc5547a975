// The CUDA backend: the ops of the forward pass as the kernels of kernels/cuda/ and cuBLAS, in
// order on one stream. Host arrays (token ids, positions, slots, the attention plan) are copied to
// device memory as needed; an array sent unchanged for every layer of a pass is sent once.
//
// Weights: F32 matrices go through cuBLAS SGEMM; F16 and BF16 matrices stay in 16 bits (half the
// bytes to read) and go through a matrix-vector kernel for up to kGemvMaxRows rows (decode) and
// cublasGemmEx, with activations rounded to the weights' type, above that (prefill). Quantized matrices (Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) stay in their GGUF blocks, so decode reads the file's
// bytes: a matrix-vector kernel dequantizes in registers for up to kGemvMaxRows rows; above that
// a slice of kDequantRows rows at a time is dequantized to f16 for cublasGemmEx. Other types
// arrive as F32 (the loader dequantizes them).
//
// Swap copies go through pinned host memory (alloc_host) on a copy stream of their own, so they
// overlap the forward pass on the compute stream: copy_fence makes them wait for the compute work
// enqueued so far (earlier passes wrote the blocks, and a pass need not end in a wait), the engine
// copies only blocks the pass in flight leaves alone, and copy_wait ends them before the blocks
// are used.
//
// Errors: a failing CUDA or cuBLAS call is logged to stderr with the call's name and error; the
// op returns without its result and error() reports the first failure from then on (the forward
// pass returns it, the engine fails its requests with INTERNAL). Nothing aborts.
#include "backend/cuda/cuda_backend.h"
#include "helios/tensor_type.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace helios {
namespace {

constexpr int32_t kGemvMaxRows = 8;   // rows through a matrix-vector kernel (one launch), more via cuBLAS
constexpr int32_t kDequantRows = 16384;  // weight rows dequantized at a time for a quantized GEMM

bool quantized_type(TensorType t) {
  switch (t) {
    case TensorType::kQ8_0: case TensorType::kQ4_0: case TensorType::kQ4_1: case TensorType::kQ5_0:
    case TensorType::kQ5_1: case TensorType::kQ4_K: case TensorType::kQ5_K: case TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}
constexpr int kMaxLoggedErrors = 20;  // a sticky fault would otherwise log once per op
constexpr size_t kMaxStagedArrays = 64;

// A host int array mirrored in device memory, sent again only when its contents change.
struct StagedInts {
  int32_t* device = nullptr;
  size_t capacity = 0;
  std::vector<int32_t> shadow;  // what `device` holds
};

enum Scratch { kScratchHalfX, kScratchAttention, kScratchStats, kScratchHalfW, kScratchSample, kScratchSampleIo, kScratchCount };

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

  void embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                 float* out) override;
  void rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps,
               float* out) override;
  void matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) override;
  void rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
            int32_t head_dim, int32_t n_rot, float freq_base, bool interleaved) override;
  void kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                const kernels::PagedKV& cache) override;
  void paged_attention(const float* q, const kernels::PagedKV& cache,
                       const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                       float* out) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* x, const float* y, int64_t n) override;

  size_t free_device_bytes() const override;
  void add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                   float eps, float* out) override;
  void exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                  float* top1_prob, float* margin, float* entropy) override;
  void sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                   const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token, float* logprob) override;
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

 private:
  // false (and a log line naming `call`) on error.
  bool ok(cudaError_t e, const char* call) const;
  bool ok_launch(int e, const char* launcher) const { return ok(static_cast<cudaError_t>(e), launcher); }
  bool ok_blas(cublasStatus_t s, const char* call) const;
  void bind() const { cudaSetDevice(device_); }  // the device is per host thread in CUDA
  const int32_t* stage(const int32_t* host, size_t n);
  void* scratch(Scratch which, size_t bytes);

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
  mutable std::mutex error_mu_;  // copies run on another host thread than the forward pass
  mutable int n_errors_ = 0;
  mutable std::string first_error_;  // sticky: after it the device's results are not trusted
};

bool CudaBackend::ok(cudaError_t e, const char* call) const {
  if (e == cudaSuccess) return true;
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
  if (blas_) cublasDestroy(blas_);
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
  ok(cudaFree(p), "cudaFree");
}

void CudaBackend::upload(float* dst, const float* src, size_t n) {
  bind();
  // From pageable memory the call returns once `src` has been staged, so it may be reused.
  ok(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload (cudaMemcpyAsync)");
}

void CudaBackend::download(float* dst, const float* src, size_t n) {
  bind();
  if (ok(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download (cudaMemcpyAsync)")) {
    ok(cudaStreamSynchronize(stream_), "download (cudaStreamSynchronize)");
  }
}

void CudaBackend::synchronize() {
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
  if (staged_.size() > kMaxStagedArrays && !staged_.count(host)) {  // callers' arrays moved
    for (auto& [h, old] : staged_) cudaFree(old.device);
    staged_.clear();
  }
  StagedInts& s = staged_[host];
  if (s.device && s.shadow.size() == n && std::memcmp(s.shadow.data(), host, n * sizeof(int32_t)) == 0) {
    return s.device;
  }
  if (n > s.capacity || !s.device) {
    cudaFree(s.device);
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

void* CudaBackend::scratch(Scratch which, size_t bytes) {
  if (bytes <= scratch_bytes_[which] && scratch_[which]) return scratch_[which];
  cudaFree(scratch_[which]);  // waits for the work that may still use it
  scratch_[which] = nullptr;
  scratch_bytes_[which] = 0;
  void* p = nullptr;
  if (!ok(cudaMalloc(&p, bytes), "cudaMalloc (scratch)")) return nullptr;
  scratch_[which] = p;
  scratch_bytes_[which] = bytes;
  return p;
}

// --- ops

void CudaBackend::embedding(const int32_t* tokens, int32_t n_tokens, const float* table,
                            int32_t dim, float* out) {
  bind();
  const int32_t* d_tokens = stage(tokens, n_tokens);
  if (!d_tokens) return;
  ok_launch(kernels::launch_embedding(d_tokens, n_tokens, table, dim, out, stream_), "launch_embedding");
}

void CudaBackend::rmsnorm(const float* x, const float* w, int32_t n_rows, int32_t dim, float eps,
                          float* out) {
  bind();
  ok_launch(kernels::launch_rmsnorm(x, w, n_rows, dim, eps, out, stream_), "launch_rmsnorm");
}

void CudaBackend::add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows,
                              int32_t dim, float eps, float* out) {
  bind();
  ok_launch(kernels::launch_add_rmsnorm(x, y, weight, n_rows, dim, eps, out, stream_), "launch_add_rmsnorm");
}

void CudaBackend::matmul(const float* x, const WeightMatrix& w, int32_t n_rows, float* y) {
  bind();
  if (n_rows <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[n_rows, n_out] = x[n_rows, n_in] · W[n_out, n_in]^T is, column-major,
  // y^T = W^T' x^T: cuBLAS sees W as an n_in × n_out matrix and transposes it.
  if (w.type == TensorType::kF32) {
    ok_blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.n_out, n_rows, w.n_in, &one,
                        static_cast<const float*>(w.data), w.n_in, x, w.n_in, &zero, y, w.n_out),
            "cublasSgemm");
    return;
  }
  const bool quantized = quantized_type(w.type), bf16 = w.type == TensorType::kBF16;
  if (w.type != TensorType::kF16 && !bf16 && !quantized) {
    ok(cudaErrorInvalidValue, "matmul (weight type not uploaded as F32, F16, BF16 or a quantized type)");
    return;
  }
  const auto type = static_cast<uint32_t>(w.type);
  if (n_rows <= kGemvMaxRows) {
    if (quantized) {
      ok_launch(kernels::launch_matmul_quant(type, x, w.data, n_rows, w.n_in, w.n_out, y, stream_),
                "launch_matmul_quant");
    } else if (bf16) {
      ok_launch(kernels::launch_matmul_bf16(x, static_cast<const uint16_t*>(w.data), n_rows, w.n_in, w.n_out, y,
                                            stream_),
                "launch_matmul_bf16");
    } else {
      ok_launch(kernels::launch_matmul_f16(x, static_cast<const uint16_t*>(w.data), n_rows, w.n_in, w.n_out, y,
                                           stream_),
                "launch_matmul_f16");
    }
    return;
  }
  const int64_t n_x = static_cast<int64_t>(n_rows) * w.n_in;
  if (bf16) {  // bfloat16 weights and activations, f32 sums
    auto* xb = static_cast<uint16_t*>(scratch(kScratchHalfX, n_x * sizeof(uint16_t)));
    if (!xb || !ok_launch(kernels::launch_f32_to_bf16(x, n_x, xb, stream_), "launch_f32_to_bf16")) return;
    ok_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.n_out, n_rows, w.n_in, &one, w.data, CUDA_R_16BF,
                         w.n_in, xb, CUDA_R_16BF, w.n_in, &zero, y, CUDA_R_32F, w.n_out, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx (BF16)");
    return;
  }
  auto* xh = static_cast<uint16_t*>(scratch(kScratchHalfX, n_x * sizeof(uint16_t)));
  if (!xh || !ok_launch(kernels::launch_f32_to_f16(x, n_x, xh, stream_), "launch_f32_to_f16")) return;
  // y[:, o0:o0+n] = x · W[o0:o0+n]^T: column-major, rows o0.. of y^T, whose leading dimension is n_out.
  auto gemm_f16 = [&](const uint16_t* wh, int32_t o0, int32_t n) {
    return ok_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, n_rows, w.n_in, &one, wh, CUDA_R_16F, w.n_in,
                                xh, CUDA_R_16F, w.n_in, &zero, y + o0, CUDA_R_32F, w.n_out, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (F16)");
  };
  if (!quantized) {
    gemm_f16(static_cast<const uint16_t*>(w.data), 0, w.n_out);
    return;
  }
  const int64_t row_bytes = tensor_row_bytes(w.type, w.n_in);
  const int32_t slice = std::min(kDequantRows, w.n_out);
  auto* wh = static_cast<uint16_t*>(scratch(kScratchHalfW, static_cast<size_t>(slice) * w.n_in * sizeof(uint16_t)));
  if (!wh) return;
  for (int32_t o0 = 0; o0 < w.n_out; o0 += slice) {
    const int32_t n = std::min(slice, w.n_out - o0);
    const void* rows = static_cast<const uint8_t*>(w.data) + static_cast<int64_t>(o0) * row_bytes;
    if (!ok_launch(kernels::launch_dequantize_f16(type, rows, n, w.n_in, wh, stream_), "launch_dequantize_f16") ||
        !gemm_f16(wh, o0, n)) {
      return;
    }
  }
}

void CudaBackend::rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
                       int32_t head_dim, int32_t n_rot, float freq_base, bool interleaved) {
  bind();
  const int32_t* d_pos = stage(positions, n_tokens);
  if (!d_pos) return;
  ok_launch(kernels::launch_rope(x, d_pos, n_tokens, n_heads, head_dim, n_rot, freq_base, interleaved, stream_),
            "launch_rope");
}

void CudaBackend::kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                           const kernels::PagedKV& cache) {
  bind();
  const int32_t* d_slots = stage(slots, n_tokens);
  if (!d_slots) return;
  ok_launch(kernels::launch_kv_write(k, v, d_slots, n_tokens, cache, stream_), "launch_kv_write");
}

void CudaBackend::paged_attention(const float* q, const kernels::PagedKV& cache,
                                  const kernels::AttentionPlan& plan, int32_t n_heads, float scale,
                                  float* out) {
  bind();
  if (plan.n_tokens <= 0) return;
  int32_t n_seqs = 0;
  for (int32_t t = 0; t < plan.n_tokens; ++t) n_seqs = std::max(n_seqs, plan.token_seq[t] + 1);
  kernels::AttentionTiles tiles = kernels::attention_tiles(
      plan, kernels::attention_tile_tokens(n_heads, cache.n_kv_heads, cache.head_dim), &tile_first_);
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
  ok_launch(kernels::launch_paged_attention(q, cache, d_plan, n_heads, scale, tiles, ws, out, stream_),
            "launch_paged_attention");
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  bind();
  ok_launch(kernels::launch_swiglu(gate, up, n, out, stream_), "launch_swiglu");
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
  bind();
  ok_launch(kernels::launch_add(x, y, n, stream_), "launch_add");
}

void CudaBackend::exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                             float* top1_prob, float* margin, float* entropy) {
  bind();
  if (n_rows <= 0) return;
  // [top1 | top1_prob | margin | entropy], n_rows each, 4 bytes per value
  auto* d = static_cast<uint8_t*>(scratch(kScratchStats, 4 * sizeof(float) * n_rows));
  if (!d) return;
  const size_t n = static_cast<size_t>(n_rows);
  auto* d_top1 = reinterpret_cast<int32_t*>(d);
  auto* d_prob = reinterpret_cast<float*>(d + 4 * n);
  auto* d_margin = reinterpret_cast<float*>(d + 8 * n);
  auto* d_entropy = reinterpret_cast<float*>(d + 12 * n);
  if (!ok_launch(kernels::launch_exit_stats(logits, n_rows, n_vocab, d_top1, d_prob, d_margin, d_entropy, stream_),
                 "launch_exit_stats")) {
    return;
  }
  std::vector<uint8_t> host(16 * n);
  if (!ok(cudaMemcpyAsync(host.data(), d, host.size(), cudaMemcpyDeviceToHost, stream_), "exit_stats (cudaMemcpyAsync)") ||
      !ok(cudaStreamSynchronize(stream_), "exit_stats (cudaStreamSynchronize)")) {
    return;
  }
  std::memcpy(top1, host.data(), 4 * n);
  std::memcpy(top1_prob, host.data() + 4 * n, 4 * n);
  std::memcpy(margin, host.data() + 8 * n, 4 * n);
  std::memcpy(entropy, host.data() + 12 * n, 4 * n);
}

void CudaBackend::sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* rows, int32_t n_rows,
                              const kernels::LogitAdjust* adjust, int32_t n_adjust, int32_t* token, float* logprob) {
  bind();
  if (n_rows <= 0) return;
  // [rows | adjust | token | logprob] up, 8-byte aligned, and the last two down after the kernels.
  // Rows go through in groups so the sort's workspace stays bounded (about 16 bytes per logit).
  constexpr int32_t kGroup = 32;
  const size_t rows_bytes = sizeof(kernels::SampleRow) * n_rows, adjust_bytes = sizeof(kernels::LogitAdjust) * n_adjust;
  const size_t adjust_at = (rows_bytes + 7) / 8 * 8, out_at = adjust_at + (adjust_bytes + 7) / 8 * 8;
  auto* io = static_cast<uint8_t*>(scratch(kScratchSampleIo, out_at + 8 * static_cast<size_t>(n_rows)));
  const int32_t group = std::min(n_rows, kGroup);
  const size_t ws_bytes = kernels::sample_rows_workspace_bytes(group, n_vocab);
  void* ws = scratch(kScratchSample, ws_bytes);
  if (!io || !ws) return;
  auto* d_rows = reinterpret_cast<kernels::SampleRow*>(io);
  auto* d_adjust = reinterpret_cast<kernels::LogitAdjust*>(io + adjust_at);
  auto* d_token = reinterpret_cast<int32_t*>(io + out_at);
  auto* d_logprob = reinterpret_cast<float*>(io + out_at + 4 * static_cast<size_t>(n_rows));
  if (!ok(cudaMemcpyAsync(d_rows, rows, rows_bytes, cudaMemcpyHostToDevice, stream_), "sample_rows (rows)")) return;
  if (n_adjust > 0 &&
      !ok(cudaMemcpyAsync(d_adjust, adjust, adjust_bytes, cudaMemcpyHostToDevice, stream_), "sample_rows (adjust)")) {
    return;
  }
  for (int32_t first = 0; first < n_rows; first += kGroup) {
    const int32_t n = std::min(kGroup, n_rows - first);
    if (!ok_launch(kernels::launch_sample_rows(logits, n_vocab, d_rows + first, n, d_adjust, ws, ws_bytes, d_token + first,
                                               d_logprob + first, stream_),
                   "launch_sample_rows")) {
      return;
    }
  }
  std::vector<uint8_t> host(8 * static_cast<size_t>(n_rows));
  if (!ok(cudaMemcpyAsync(host.data(), io + out_at, host.size(), cudaMemcpyDeviceToHost, stream_), "sample_rows (download)") ||
      !ok(cudaStreamSynchronize(stream_), "sample_rows (cudaStreamSynchronize)")) {
    return;
  }
  std::memcpy(token, host.data(), 4 * static_cast<size_t>(n_rows));
  std::memcpy(logprob, host.data() + 4 * static_cast<size_t>(n_rows), 4 * static_cast<size_t>(n_rows));
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  auto backend = std::make_unique<CudaBackend>(device);
  HELIOS_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace helios
