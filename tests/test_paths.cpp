#include "test_paths.h"

#include <unistd.h>

#include <filesystem>

namespace helios::testing {

std::string source_dir() { return HELIOS_SOURCE_DIR; }
std::string shared_data_dir() { return HELIOS_SHARED_DATA_DIR; }
std::string models_dir() { return HELIOS_MODELS_DIR; }
std::string default_model_path() {
  return std::string(HELIOS_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string temp_dir() {
  static const std::string dir = [] {
    auto path = std::filesystem::temp_directory_path() /
                ("helios-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path.string();
  }();
  return dir;
}

}  // namespace helios::testing
