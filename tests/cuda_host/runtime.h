// Between the fiber scheduler and the emulated runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>

namespace helios::cuda_host {

// cudaSuccess when the launch may run, else the error CUDA gives the launch for its configuration.
cudaError_t launch_error(dim3 grid, dim3 block, size_t dynamic_smem);
// Every block of the grid, now, on this host thread.
void run_grid(const char* kernel, dim3 grid, dim3 block, size_t dynamic_smem, bool chained,
              std::function<void()>& body);

// A kernel broke a rule of CUDA's: the device's sticky error from now on, and a line on stderr.
void report_kernel_fault(const std::string& what);
bool kernel_faulted();

}  // namespace helios::cuda_host
