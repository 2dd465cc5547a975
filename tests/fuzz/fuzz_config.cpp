// Bytes → the heliosd config loader (YAML → HeliosConfig, every section validated). A config is
// accepted, or refused with INVALID_ARGUMENT naming FILE:LINE:COLUMN; INTERNAL means a reader
// used an unchecked accessor (the loader's catch of last resort), which is a bug.
#include <string>

#include "fuzz_common.h"
#include "helios/config.h"

namespace helios::fuzz {
namespace {

void run(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = parse_config(text, "configs/fuzz.yaml");
  if (!config.ok()) {
    const Status& s = config.status();
    if (s.code() != StatusCode::kInvalidArgument) die("config refused with " + s.to_string());
    if (s.message().rfind("configs/fuzz.yaml:", 0) != 0) die("config error without its place: " + s.message());
    return;
  }
  if (config->models.empty() && config->groups.empty()) die("a config without models or groups was accepted");
  for (const ModelEntryConfig& m : config->models) {
    if (m.name.empty() || m.path.empty()) die("a model without a name or path was accepted");
  }
  const int32_t block = config->engine.block_size;
  if (block < 1 || (block & (block - 1)) != 0) die("engine.block_size " + std::to_string(block) + " was accepted");
}

}  // namespace
}  // namespace helios::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
