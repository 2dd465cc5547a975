#include "helios/backend.h"

namespace helios {

StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, int n_threads) {
  if (name == "cpu") return make_cpu_backend(n_threads);
  return invalid_argument("unknown backend '" + name + "' (this build supports: cpu)");
}

}  // namespace helios
