// The CUDA backend (HELIOS_CUDA builds only).
#pragma once

#include <memory>

#include "helios/backend.h"

namespace helios {

// A backend on CUDA device `device`. FAILED_PRECONDITION when there is no such device or the
// runtime cannot start on it, naming the CUDA call and its error.
StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device);

}  // namespace helios
