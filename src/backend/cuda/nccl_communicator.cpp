// Tensor-parallel collectives between CUDA devices of one process through NCCL.
//
// Each collective runs on the communicator's own stream after the rank's backend has finished
// its queued work (Backend::synchronize), and is waited for before the pass goes on: simple and
// correct; overlapping it with the backend's stream is left for later. all_gather_columns is an
// all-reduce of a zeroed [n_rows, out_width] buffer into which each rank wrote its own columns:
// adding zeros is exact, and NCCL's all-gather needs equal counts, which vocabulary shards are not.
// A failed call is logged and kept as the communicator's error(), which fails the pass.
//
// A rank that fails mid-pass aborts the group (ncclCommAbort on every rank's communicator): the
// NCCL kernels of the ranks waiting for it end, their collectives return, and the pass fails
// instead of hanging. reset() makes the communicators again (ncclCommInitAll) for the next pass.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace helios {
namespace {

int device_of(const Backend& b) {
  const std::string n = b.name();  // "cuda:N"
  const size_t colon = n.find(':');
  return colon == std::string::npos ? 0 : std::stoi(n.substr(colon + 1));
}

// The group's communicators, one per rank, shared so that any rank can abort them all.
struct NcclGroup {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;  // null once aborted, until reset
  // Shared while a rank enqueues a collective, exclusive to abort or remake the communicators:
  // no collective is enqueued on a communicator being torn down.
  std::shared_mutex mu;
  bool aborted = false;

  ~NcclGroup() {
    for (size_t r = 0; r < comms.size(); ++r) {
      if (!comms[r]) continue;
      cudaSetDevice(devices[r]);
      ncclCommDestroy(comms[r]);
    }
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, Backend* backend, int32_t rank)
      : group_(std::move(group)), backend_(backend), device_(device_of(*backend)), rank_(rank) {
    cudaSetDevice(device_);
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return static_cast<int32_t>(group_->devices.size()); }

  void all_reduce_sum(float* data, size_t n) override {
    backend_->synchronize();
    cudaSetDevice(device_);
    enqueue("ncclAllReduce", [&](ncclComm_t comm) {
      return ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm, stream_);
    });
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
    enqueue("ncclAllReduce (gather)", [&](ncclComm_t comm) {
      return ncclAllReduce(out, out, static_cast<size_t>(n_rows) * out_width, ncclFloat, ncclSum, comm, stream_);
    });
    ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (gather)");
  }

  void abort() override {
    std::unique_lock lock(group_->mu);
    if (group_->aborted) return;
    group_->aborted = true;
    for (size_t r = 0; r < group_->comms.size(); ++r) {
      cudaSetDevice(group_->devices[r]);
      ncclCommAbort(group_->comms[r]);  // the rank's kernels waiting on the others end
      group_->comms[r] = nullptr;
    }
    cudaSetDevice(device_);
  }

  void reset() override {
    std::unique_lock lock(group_->mu);
    if (!group_->aborted) return;
    std::vector<ncclComm_t> comms(group_->devices.size());
    const ncclResult_t r = ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), group_->devices.data());
    if (r != ncclSuccess) {  // the group stays aborted: every later collective fails at once
      fail("ncclCommInitAll (after an abort)", ncclGetErrorString(r));
      return;
    }
    group_->comms = std::move(comms);
    group_->aborted = false;
  }

  Status error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.empty() ? ok_status() : internal_error(error_);
  }

 private:
  // call(comm) on this rank's communicator, unless the group is aborted: that pass has failed
  // already (the rank that aborted says why), so skipping is no error of this rank's.
  template <typename Call>
  void enqueue(const char* what, Call&& call) {
    std::shared_lock lock(group_->mu);
    if (group_->aborted) return;
    ok(call(group_->comms[rank_]), what);
  }
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

  std::shared_ptr<NcclGroup> group_;
  Backend* backend_;
  int device_;
  int32_t rank_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  auto group = std::make_shared<NcclGroup>();
  group->devices.resize(n);
  for (int r = 0; r < n; ++r) group->devices[r] = device_of(*ranks[r]);
  group->comms.resize(n);
  const ncclResult_t res = ncclCommInitAll(group->comms.data(), n, group->devices.data());
  if (res != ncclSuccess) {
    group->comms.assign(n, nullptr);
    return failed_precondition(std::string("tensor parallelism: ncclCommInitAll failed: ") + ncclGetErrorString(res));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(group, ranks[r], r));
  return out;
}

}  // namespace helios
