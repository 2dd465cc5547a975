#include "test_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "helios/model_tools.h"

namespace helios::testing {

// HELIOS_SOURCE_DIR in the environment names the checkout when the test binary runs away from
// the tree it was built in (bench/gpu/run_device.sh runs a prebuilt bundle on a GPU machine).
static const char* relocated_root() {
  const char* root = std::getenv("HELIOS_SOURCE_DIR");
  return root && *root ? root : nullptr;
}

std::string source_dir() { return relocated_root() ? relocated_root() : HELIOS_SOURCE_DIR; }
std::string test_data_dir() {
  return relocated_root() ? std::string(relocated_root()) + "/tests/data" : HELIOS_TEST_DATA_DIR;
}
std::string models_dir() { return relocated_root() ? std::string(relocated_root()) + "/models" : HELIOS_MODELS_DIR; }
std::string default_model_path() { return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

std::string temp_dir() {
  static const std::string dir = [] {
    auto path = std::filesystem::temp_directory_path() /
                ("helios-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path.string();
  }();
  return dir;
}

std::string stories260k_path() {
  const std::string dir = test_data_dir() + "/stories260K/";
  const std::string out = temp_dir() + "/stories260K.gguf";
  if (!std::filesystem::exists(out)) {
    const Status s = convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", out);
    if (!s.ok()) {
      ADD_FAILURE() << "cannot convert stories260K from " << dir << "stories260K.bin and tok512.bin: "
                    << s.to_string() << " (both are committed; restore them with `git checkout -- tests/data`)";
    }
  }
  return out;
}

}  // namespace helios::testing
