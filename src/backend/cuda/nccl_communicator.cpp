// Tensor-parallel collectives between CUDA devices of one process through NCCL.
//
// Each collective runs on the communicator's own stream after the rank's backend has finished
// its queued work (Backend::synchronize), and is waited for before the pass goes on: simple and
// correct; overlapping it with the backend's stream is left for later. all_gather_columns is an
// all-reduce of a zeroed [n_rows, out_width] buffer into which each rank wrote its own columns:
// adding zeros is exact, and NCCL's all-gather needs equal counts, which vocabulary shards are not.
// A failed call is logged and kept as the communicator's error(), which fails the pass.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_backend.h"

namespace helios {
namespace {

int device_of(const Backend& b) {
  const std::string n = b.name();  // "cuda:N"
  const size_t colon = n.find(':');
  return colon == std::string::npos ? 0 : std::stoi(n.substr(colon + 1));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, Backend* backend, int32_t rank, int32_t world)
      : comm_(comm), backend_(backend), device_(device_of(*backend)), rank_(rank), world_(world) {
    cudaSetDevice(device_);
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return world_; }

  void all_reduce_sum(float* data, size_t n) override {
    backend_->synchronize();
    cudaSetDevice(device_);
    ok(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (all-reduce)");
  }

  void all_gather_columns(const float* local, int32_t n_rows, int32_t width, int32_t offset, float* out,
                          int32_t out_width) override {
    backend_->synchronize();
    cudaSetDevice(device_);
    const size_t row = static_cast<size_t>(out_width) * sizeof(float);
    ok(cudaMemsetAsync(out, 0, row * static_cast<size_t>(n_rows), stream_), "cudaMemsetAsync (gather)");
    if (width > 0 && offset < out_width) {
      const int32_t n_copy = std::min(width, out_width - offset);
      ok(cudaMemcpy2DAsync(out + offset, row, local, static_cast<size_t>(width) * sizeof(float),
                           static_cast<size_t>(n_copy) * sizeof(float), static_cast<size_t>(n_rows),
                           cudaMemcpyDeviceToDevice, stream_),
         "cudaMemcpy2DAsync (gather)");
    }
    ok(ncclAllReduce(out, out, static_cast<size_t>(n_rows) * out_width, ncclFloat, ncclSum, comm_, stream_),
       "ncclAllReduce (gather)");
    ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (gather)");
  }

  Status error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.empty() ? ok_status() : internal_error(error_);
  }

 private:
  void ok(ncclResult_t r, const char* call) {
    if (r != ncclSuccess) fail(call, ncclGetErrorString(r));
  }
  void ok(cudaError_t e, const char* call) {
    if (e != cudaSuccess) fail(call, cudaGetErrorString(e));
  }
  void fail(const char* call, const char* why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;  // the first failure says what went wrong; the rest follow from it
    error_ = "tensor parallelism: rank " + std::to_string(rank_) + " on " + backend_->name() + ": " + call + ": " + why;
    std::fprintf(stderr, "helios: %s\n", error_.c_str());
  }

  ncclComm_t comm_;
  Backend* backend_;
  int device_;
  int32_t rank_, world_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = device_of(*ranks[r]);
  std::vector<ncclComm_t> comms(n);
  const ncclResult_t res = ncclCommInitAll(comms.data(), n, devices.data());
  if (res != ncclSuccess) {
    return failed_precondition(std::string("tensor parallelism: ncclCommInitAll failed: ") + ncclGetErrorString(res));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[r], ranks[r], r, n));
  return out;
}

}  // namespace helios
