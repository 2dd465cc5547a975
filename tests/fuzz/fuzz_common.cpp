#include "fuzz_common.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "helios/gguf.h"
#include "helios/model_tools.h"

namespace helios::fuzz {

void die(const std::string& what) {
  std::fprintf(stderr, "fuzz fixture: %s\n", what.c_str());
  std::abort();
}

std::string source_dir() { return HELIOS_SOURCE_DIR; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string temp_dir() {
  // Never destroyed: the exit handler that removes it runs after static destructors.
  static const std::string* dir = [] {
    auto path = std::filesystem::temp_directory_path() / ("helios-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    auto* p = new std::string(path.string());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return p;
  }();
  return *dir;
}

const std::string& stories260k_gguf() {
  static const std::string path = [] {
    const std::string dir = source_dir() + "/tests/data/stories260K/";
    const std::string out = temp_dir() + "/stories260K.gguf";
    const Status s = convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", out);
    if (!s.ok()) die("cannot convert stories260K: " + s.to_string());
    return out;
  }();
  return path;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& gguf_path) {
  auto file = GgufFile::open(gguf_path);
  if (!file.ok()) die(file.status().to_string());
  auto spec = tokenizer_spec_from_gguf(**file);
  if (!spec.ok()) die(spec.status().to_string());
  auto tok = Tokenizer::create(std::move(*spec));
  if (!tok.ok()) die(tok.status().to_string());
  return std::move(*tok);
}

std::string smollm2_path_if_present() {
  const std::string path = source_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(path) ? path : "";
}

std::pair<std::string_view, std::string_view> split_input(std::string_view data, std::string_view separator) {
  const size_t at = data.find(separator);
  if (at == std::string_view::npos) return {data, {}};
  return {data.substr(0, at), data.substr(at + separator.size())};
}

namespace {
// What the code under test logs (a chat template's fallback, say) is noise at millions of runs.
const bool kQuiet = [] {
  spdlog::set_level(spdlog::level::off);
  return true;
}();
}  // namespace

}  // namespace helios::fuzz
