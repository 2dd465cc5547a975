#include "test_paths.h"

#include <unistd.h>

#include <filesystem>

#include "helios/model_tools.h"

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

std::string stories260k_path() {
  const std::string cached = models_dir() + "/stories260K.gguf";
  if (std::filesystem::exists(cached)) return cached;
  const std::string dir = shared_data_dir() + "/models/stories260K/";
  const std::string out = temp_dir() + "/stories260K.gguf";
  if (!std::filesystem::exists(out)) {
    const Status s = convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", out);
    if (!s.ok()) return cached;  // the caller's load then names the missing file
  }
  return out;
}

}  // namespace helios::testing
