// The CUDA runtime, cuBLAS and NCCL calls the backend and its tests make, on the host: device
// memory is host memory, and a stream is a queue of work that runs only when something waits for
// it (a synchronize, an event, a copy to pageable memory, cudaFree), so a result read before its
// stream is synchronised is stale, as it can be on a GPU. Graph capture records the work instead
// and a launch replays it with the arguments of the capture; a call that is not allowed while
// capturing (synchronising, allocating) fails and invalidates the capture. The legacy default
// stream runs its work at once, after the blocking streams' work.
//
// Devices: HELIOS_CUDA_HOST_DEVICES (default 1), each HELIOS_CUDA_HOST_MEMORY_MB of memory
// (default 4096); cudaMalloc beyond it is cudaErrorMemoryAllocation.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_host/runtime.h"

using Work = std::function<void()>;

struct CUgraph_st {
  std::vector<Work> work;
  bool invalidated = false;
};
struct CUgraphExec_st {
  std::vector<Work> work;
};

// A queue entry: work, or a wait until another stream has run `position` entries.
struct QueueEntry {
  Work work;
  CUstream_st* wait_for = nullptr;
  uint64_t position = 0;
};

struct CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  std::deque<QueueEntry> queue;
  uint64_t enqueued = 0, done = 0;
  CUgraph_st* capture = nullptr;
  bool capture_origin = false;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;  // null: complete
  uint64_t position = 0;
  CUgraph_st* capture = nullptr;
};

namespace helios::cuda_host {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
int device_count() { return std::clamp(env_int("HELIOS_CUDA_HOST_DEVICES", 1), 0, 8); }
size_t device_memory() { return static_cast<size_t>(std::max(env_int("HELIOS_CUDA_HOST_MEMORY_MB", 4096), 1)) << 20; }

struct Allocation {
  size_t bytes;
  int device;
  bool pinned;
  char* mapping;  // the allocation sits at the end of it, against a page no one may touch
  size_t mapping_bytes;
};

std::mutex state_mutex;  // guards everything below
std::map<const char*, Allocation> allocations;
size_t used[8] = {};
std::vector<CUstream_st*> streams;

std::atomic<bool> faulted{false};
thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::vector<CUstream_st*> capturing;  // this thread's capturing streams

cudaError_t sticky() { return faulted ? cudaErrorLaunchFailure : cudaSuccess; }

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

const Allocation* find_allocation(const void* p) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = allocations.upper_bound(static_cast<const char*>(p));
  if (it == allocations.begin()) return nullptr;
  --it;
  const char* base = it->first;
  return static_cast<const char*>(p) < base + std::max<size_t>(it->second.bytes, 1) ? &it->second : nullptr;
}
bool is_pinned(const void* p) {
  const Allocation* a = find_allocation(p);
  return a && a->pinned;
}

CUstream_st* real(cudaStream_t s) {
  return s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr : s;
}

// Runs `s`'s entries until it has run `position`, first running what they wait for.
void complete(CUstream_st* s, uint64_t position) {
  while (s->done < position && !s->queue.empty()) {
    QueueEntry e = std::move(s->queue.front());
    s->queue.pop_front();
    if (e.wait_for) {
      complete(e.wait_for, e.position);
    } else if (!faulted) {
      e.work();
    }
    ++s->done;
  }
}
void complete(CUstream_st* s) { complete(s, s->enqueued); }

// The streams of the current device (all of them, or only the blocking ones) run to their end.
void complete_device(bool blocking_only) {
  std::vector<CUstream_st*> mine;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    for (CUstream_st* s : streams) {
      if (s->device == current_device && (!blocking_only || s->blocking)) mine.push_back(s);
    }
  }
  for (CUstream_st* s : mine) complete(s);
}

// Work in stream order: recorded while capturing, at once on the legacy default stream, else queued.
void enqueue(cudaStream_t stream, Work work) {
  CUstream_st* s = real(stream);
  if (s && s->capture) {
    s->capture->work.push_back(std::move(work));
  } else if (!s) {
    complete_device(true);
    if (!faulted) work();
  } else {
    s->queue.push_back({std::move(work), nullptr, 0});
    ++s->enqueued;
  }
}

// A call that may not run while this thread captures: it invalidates the capture.
bool refused_while_capturing() {
  if (capturing.empty()) return false;
  for (CUstream_st* s : capturing) s->capture->invalidated = true;
  last_error = cudaErrorStreamCaptureUnsupported;
  return true;
}

bool bad_device(int d) { return d < 0 || d >= device_count(); }

}  // namespace

void enqueue_work(cudaStream_t stream, std::function<void()> work) { enqueue(stream, std::move(work)); }

void report_kernel_fault(const std::string& what) {
  if (!faulted.exchange(true)) std::fprintf(stderr, "cuda_host: kernel fault: %s\n", what.c_str());
}
bool kernel_faulted() { return faulted; }

void launch_grid(const char* name, dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, bool chained,
                 std::function<void()> body) {
  if (const cudaError_t e = launch_error(grid, block, dynamic_smem); e != cudaSuccess) {
    set_error(e);
    return;
  }
  enqueue(stream, [name, grid, block, dynamic_smem, chained, body]() mutable {
    run_grid(name, grid, block, dynamic_smem, chained, body);
  });
}

}  // namespace helios::cuda_host

using namespace helios::cuda_host;

// --- Errors

cudaError_t cudaGetLastError() {
  if (faulted) return cudaErrorLaunchFailure;
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return faulted ? cudaErrorLaunchFailure : last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    default: return cudaGetErrorName(e);
  }
}

// --- Devices and memory

cudaError_t cudaGetDeviceCount(int* n) {
  *n = device_count();
  return *n > 0 ? cudaSuccess : set_error(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (bad_device(d)) return set_error(cudaErrorInvalidDevice);
  current_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}

// Each allocation ends where an inaccessible page begins (and one more guards the page below its
// mapping), so a kernel that reads or writes past its end faults there, and says so (see
// report_stray_access), instead of reading a neighbour's bytes.
static cudaError_t allocate(void** p, size_t bytes, bool pinned) {
  *p = nullptr;
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (faulted) return cudaErrorLaunchFailure;
  constexpr size_t kPage = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;  // cudaMalloc's granularity
  const size_t span = (rounded + kPage - 1) / kPage * kPage;
  std::lock_guard<std::mutex> lock(state_mutex);
  if (!pinned && used[current_device] + rounded > device_memory()) return set_error(cudaErrorMemoryAllocation);
  void* m = mmap(nullptr, span + 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
  char* mapping = static_cast<char*>(m);
  mprotect(mapping, kPage, PROT_NONE);
  mprotect(mapping + kPage + span, kPage, PROT_NONE);
  char* q = mapping + kPage + (span - rounded);
  std::memset(q, 0xFF, rounded);  // nothing initialises device memory: NaN floats, -1 ints
  allocations[q] = Allocation{rounded, current_device, pinned, mapping, span + 2 * kPage};
  if (!pinned) used[current_device] += rounded;
  *p = q;
  return cudaSuccess;
}
static cudaError_t release(void* p, bool pinned) {
  if (!p) return cudaSuccess;
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  complete_device(false);  // as CUDA: freeing waits for the device's work
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = allocations.find(static_cast<const char*>(p));
  if (it == allocations.end() || it->second.pinned != pinned) return set_error(cudaErrorInvalidValue);
  if (!pinned) used[it->second.device] -= it->second.bytes;
  munmap(it->second.mapping, it->second.mapping_bytes);
  allocations.erase(it);
  return sticky();
}

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, false); }
cudaError_t cudaFree(void* p) { return release(p, false); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return allocate(p, bytes, true); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocate(p, bytes, true); }
cudaError_t cudaFreeHost(void* p) { return release(p, true); }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(state_mutex);
  *total = device_memory();
  *free_bytes = *total - used[current_device];
  return cudaSuccess;
}

// --- Copies

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  complete_device(true);  // the legacy default stream: after the blocking streams' work
  if (faulted) return cudaErrorLaunchFailure;
  std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  if (faulted) return cudaErrorLaunchFailure;
  CUstream_st* s = real(stream);
  const bool from_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                         (kind == cudaMemcpyDefault && !find_allocation(src));
  const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                       (kind == cudaMemcpyDefault && !find_allocation(dst));
  if (from_host && !is_pinned(src) && !(s && s->capture)) {
    // Pageable memory is staged before the call returns: the copy reads the bytes of this moment.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    enqueue(stream, [dst, src, n] { std::memmove(dst, src, n); });
  }
  // Into pageable memory the call returns when the copy is done.
  if (to_host && !is_pinned(dst) && s && !s->capture) complete(s);
  return sticky();
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return set_error(cudaErrorInvalidValue);
  enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    }
  });
  return sticky();
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  enqueue(stream, [p, value, n] { std::memset(p, value, n); });
  return sticky();
}
cudaError_t cudaMemset(void* p, int value, size_t n) {
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  complete_device(true);
  std::memset(p, value, n);
  return sticky();
}

// --- Streams, events, synchronisation

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  auto* stream = new CUstream_st;
  stream->device = current_device;
  stream->blocking = !(flags & cudaStreamNonBlocking);
  std::lock_guard<std::mutex> lock(state_mutex);
  streams.push_back(stream);
  *s = stream;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  CUstream_st* s = real(stream);
  if (!s) return set_error(cudaErrorInvalidResourceHandle);
  complete(s);  // its work still runs
  std::lock_guard<std::mutex> lock(state_mutex);
  streams.erase(std::remove(streams.begin(), streams.end(), s), streams.end());
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = real(stream);
  if (s && s->capture) {
    s->capture->invalidated = true;
    return set_error(cudaErrorStreamCaptureUnsupported);
  }
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (s) {
    complete(s);
  } else {
    complete_device(true);
  }
  return sticky();
}
cudaError_t cudaDeviceSynchronize() {
  if (refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  complete_device(false);
  return sticky();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  CUstream_st* s = real(stream);
  e->capture = s ? s->capture : nullptr;
  if (e->capture) return cudaSuccess;  // ordering inside a capture is the capture's own
  if (!s) complete_device(true);
  e->stream = s;
  e->position = s ? s->enqueued : 0;
  return sticky();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  CUstream_st* s = real(stream);
  if (e->capture) {  // joins the capture: its work from now on is part of the graph
    if (s && !s->capture) s->capture = e->capture;
    return cudaSuccess;
  }
  if (!e->stream || (s && s->capture)) return sticky();
  if (!s) {
    complete(e->stream, e->position);
  } else {
    s->queue.push_back({nullptr, e->stream, e->position});
    ++s->enqueued;
  }
  return sticky();
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e->stream) complete(e->stream, e->position);
  return sticky();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return !e->stream || e->stream->done >= e->position ? sticky() : cudaErrorNotReady;
}

// --- Graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUstream_st* s = real(stream);
  if (!s || s->capture) return set_error(s ? cudaErrorIllegalState : cudaErrorStreamCaptureUnsupported);
  s->capture = new CUgraph_st;
  s->capture_origin = true;
  capturing.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = real(stream);
  *graph = nullptr;
  if (!s || !s->capture_origin) return set_error(cudaErrorIllegalState);
  CUgraph_st* g = s->capture;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    for (CUstream_st* other : streams) {
      if (other->capture == g) other->capture = nullptr;
    }
  }
  s->capture = nullptr;
  s->capture_origin = false;
  capturing.erase(std::remove(capturing.begin(), capturing.end(), s), capturing.end());
  if (g->invalidated) {
    delete g;
    return set_error(cudaErrorStreamCaptureInvalidated);
  }
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  CUstream_st* s = real(stream);
  *status = s && s->capture ? (s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                            : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  enqueue(stream, [work = exec->work] {
    for (const Work& w : work) w();
  });
  return sticky();
}

// --- cuBLAS: the GEMMs the backend asks for, column-major, accumulated in float.

struct cublasContext {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

namespace {

float element(const void* p, cudaDataType type, size_t i) {
  switch (type) {
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

bool storable(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt, int ldb, float beta, void* c,
                    cudaDataType ct, int ldc) {
  const bool a_t = ta != CUBLAS_OP_N, b_t = tb != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_t ? k : m) || ldb < std::max(1, b_t ? n : k) ||
      ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!storable(at) || at != bt || !storable(ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
  enqueue(h->stream, [=] {
    std::vector<float> row(k), col(k);
    for (int j = 0; j < n; ++j) {
      for (int p = 0; p < k; ++p) col[p] = element(b, bt, b_t ? j + static_cast<size_t>(p) * ldb : p + static_cast<size_t>(j) * ldb);
      for (int i = 0; i < m; ++i) {
        for (int p = 0; p < k; ++p) row[p] = element(a, at, a_t ? p + static_cast<size_t>(i) * lda : i + static_cast<size_t>(p) * lda);
        float sum = 0;
        for (int p = 0; p < k; ++p) sum += row[p] * col[p];
        const size_t at_c = i + static_cast<size_t>(j) * ldc;
        const float prior = beta == 0.0f ? 0.0f : beta * element(c, ct, at_c);  // beta 0: C is not read
        const float out = alpha * sum + prior;
        switch (ct) {
          case CUDA_R_16F: static_cast<__half*>(c)[at_c] = __float2half_rn(out); break;
          case CUDA_R_16BF: static_cast<__nv_bfloat16*>(c)[at_c] = __float2bfloat16_rn(out); break;
          default: static_cast<float*>(c)[at_c] = out; break;
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta,
                              float* c, int ldc) {
  return gemm(h, ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c, CUDA_R_32F, ldc);
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt,
                            int ldb, const void* beta, void* c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_16F && compute != CUBLAS_COMPUTE_32F_FAST_16BF &&
      compute != CUBLAS_COMPUTE_32F_FAST_TF32 && compute != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return gemm(h, ta, tb, m, n, k, *static_cast<const float*>(alpha), a, at, lda, b, bt, ldb,
              *static_cast<const float*>(beta), c, ct, ldc);
}

// --- NCCL: the ranks of one ncclCommInitAll meet in each collective, each on its own host thread.

struct NcclGroup {
  std::mutex m;
  std::condition_variable cv;
  int n = 0, arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<std::pair<const float*, float*>> buffers;
  size_t count = 0;
};

struct ncclComm {
  int rank = 0, device = 0;
  std::shared_ptr<NcclGroup> group;
};

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int n, const int* devices) {
  if (n < 1) return ncclInvalidArgument;
  auto group = std::make_shared<NcclGroup>();
  group->n = n;
  group->buffers.resize(n);
  for (int r = 0; r < n; ++r) {
    const int d = devices ? devices[r] : r;
    if (bad_device(d)) return ncclInvalidArgument;
    comms[r] = new ncclComm{r, d, group};
  }
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  {
    std::lock_guard<std::mutex> lock(c->group->m);
    c->group->aborted = true;
  }
  c->group->cv.notify_all();
  delete c;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    default: return "unhandled NCCL error";
  }
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat || op != ncclSum) return ncclInvalidArgument;
  std::shared_ptr<NcclGroup> g = comm->group;
  const int rank = comm->rank;
  enqueue(stream, [g, rank, send, recv, count] {
    std::unique_lock<std::mutex> lock(g->m);
    if (g->aborted) return;
    g->buffers[rank] = {static_cast<const float*>(send), static_cast<float*>(recv)};
    g->count = count;
    const uint64_t generation = g->generation;
    if (++g->arrived == g->n) {  // the last rank to arrive sums, in rank order, for every rank
      std::vector<float> sum(count, 0.0f);
      for (int r = 0; r < g->n; ++r) {
        for (size_t i = 0; i < count; ++i) sum[i] += g->buffers[r].first[i];
      }
      for (int r = 0; r < g->n; ++r) std::memcpy(g->buffers[r].second, sum.data(), count * sizeof(float));
      g->arrived = 0;
      ++g->generation;
      g->cv.notify_all();
    } else {
      g->cv.wait(lock, [&] { return g->generation != generation || g->aborted; });
    }
  });
  return ncclSuccess;
}
