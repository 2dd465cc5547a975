// The CUDA backend (HELIOS_CUDA builds only).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "helios/backend.h"
#include "helios/tensor_parallel.h"

namespace helios {

// A backend on CUDA device `device`. FAILED_PRECONDITION when there is no such device or the
// runtime cannot start on it, naming the CUDA call and its error.
StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device);

// Activation rows up to which the CUDA backend multiplies a matrix of `type` (n_in columns) with
// a matrix-vector kernel instead of cuBLAS: 8 for F16 and BF16; for quantized types, in 8-bit
// activations, as many as read about the bytes that dequantizing to f16 for cuBLAS does (Q4_0 and
// Q4_K 64, Q5_K 48, Q6_K 40, Q8_0 32); 0 for F32 (always cuBLAS) and other types.
int32_t cuda_gemv_max_rows(TensorType type, int32_t n_in);

// NCCL communicators for tensor-parallel ranks on CUDA backends, one device each (rank r on
// ranks[r], "cuda:N"), in one process (ncclCommInitAll). FAILED_PRECONDITION naming the NCCL
// call when NCCL cannot start.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& ranks);

}  // namespace helios
