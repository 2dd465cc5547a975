// The process-wide switch for chained launches (common.cuh), for measuring what they save.
#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {

void set_chained_launches(bool on) { cuda::chained_launches_wanted.store(on); }
bool chained_launches() { return cuda::chained_launches_wanted.load(); }

}  // namespace helios::kernels
