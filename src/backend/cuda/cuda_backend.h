// The CUDA backend (HELIOS_CUDA builds only).
#pragma once

#include <memory>

#include <vector>

#include "helios/backend.h"
#include "helios/tensor_parallel.h"

namespace helios {

// A backend on CUDA device `device`. FAILED_PRECONDITION when there is no such device or the
// runtime cannot start on it, naming the CUDA call and its error.
StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device);

// NCCL communicators for tensor-parallel ranks on CUDA backends, one device each (rank r on
// ranks[r], "cuda:N"), in one process (ncclCommInitAll). FAILED_PRECONDITION naming the NCCL
// call when NCCL cannot start.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& ranks);

}  // namespace helios
