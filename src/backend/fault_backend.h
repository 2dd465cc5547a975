// Fault injection for tests of the server's failure paths: a Backend that runs another backend's
// ops and fails or stalls on purpose, as a broken device would. Built only with the CMake option
// HELIOS_FAULT_INJECTION (on by default when the tests are built); heliosd turns it on from the
// HELIOS_FAULTS environment variable and says so loudly in its log.
//
// HELIOS_FAULTS is a comma-separated list of faults, each counted in matmuls of one model's
// backend from when the FaultTrigger is armed (heliosd arms it as it starts serving, so loading
// and the start-up profile of intercepts.profile_at_start do not count):
//   backend_error_after_matmuls=N     once N matmuls have run, error() reports a device fault
//                                     (sticky), as a failed CUDA call does: the forward pass
//                                     that ran the N-th matmul fails, and every later one
//   stall_after_matmuls=N:SECONDS     once N matmuls have run, the next one blocks for SECONDS
//                                     (once), as a hung kernel does
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "helios/backend.h"

namespace helios {

struct FaultPlan {
  int64_t error_after_matmuls = -1;  // -1: no device error
  int64_t stall_after_matmuls = -1;  // -1: no stall
  double stall_seconds = 0;
  bool empty() const { return error_after_matmuls < 0 && stall_after_matmuls < 0; }
  std::string describe() const;  // for the start-up warning
};

// Shared by the backends of one plan: until armed, they count nothing and inject nothing.
struct FaultTrigger {
  std::atomic<bool> armed{false};
};

// The faults a spec names. INVALID_ARGUMENT for an unknown fault (naming the valid ones) or a
// malformed value (naming the expected form).
StatusOr<FaultPlan> parse_fault_plan(std::string_view spec);

// `inner` with the plan's faults once `trigger` is armed (null: armed from the start); its ops,
// memory and error() otherwise.
std::unique_ptr<Backend> make_fault_backend(std::unique_ptr<Backend> inner, const FaultPlan& plan,
                                            std::shared_ptr<const FaultTrigger> trigger = nullptr);

}  // namespace helios
