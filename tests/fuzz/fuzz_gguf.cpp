// GGUF bytes → the reader, then everything loading a model checks before a tensor is used: the
// hyper-parameters, the tokenizer (built and run once), the weights against the shapes the
// hyper-parameters imply (uploaded to the CPU backend), and an exit-heads sidecar.
#include <cstring>
#include <fstream>
#include <memory>

#include "fuzz_common.h"
#include "helios/backend.h"
#include "helios/early_exit.h"
#include "helios/gguf.h"
#include "helios/model_config.h"
#include "helios/weights.h"

namespace helios::fuzz {
namespace {

// An exit-heads sidecar is read from a path: the image goes to a file, for a model of the
// file's own claimed shape (so that the checks past the shape check run too).
void load_as_sidecar(const GgufFile& file, const uint8_t* data, size_t size) {
  auto n_layer = file.get_uint("helios.exits.n_layer");
  auto n_embd = file.get_uint("helios.exits.n_embd");
  if (!n_layer.ok() || !n_embd.ok() || *n_layer > 1024 || *n_embd > 65536) return;
  const std::string path = temp_dir() + "/sidecar.gguf";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  ModelConfig config;
  config.n_layer = static_cast<int32_t>(*n_layer);
  config.n_embd = static_cast<int32_t>(*n_embd);
  auto heads = load_exit_heads(path, config);
  if (!heads.ok()) return;
  for (const ExitHeadParams& h : heads->heads) {
    if (h.layer < 1 || h.layer >= config.n_layer) die("a loaded exit head is outside the model's layers");
  }
}

void run(const uint8_t* data, size_t size) {
  // An exact-size copy: a read one byte past the image is a heap overflow ASan sees.
  std::unique_ptr<uint8_t[]> image(new uint8_t[size ? size : 1]);
  if (size) std::memcpy(image.get(), data, size);
  auto file = GgufFile::parse(size ? image.get() : nullptr, size, "fuzz.gguf");
  if (!file.ok()) return;
  const GgufFile& f = **file;
  for (const std::string& key : f.keys()) {
    const GgufValue* v = f.find(key);
    if (!v) die("a listed key is not found: " + key);
    (void)v->to_display_string();
  }
  volatile uint8_t sink = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) die("a listed tensor is not found: " + t.name);
    if (t.n_bytes) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
  }
  (void)sink;

  if (auto arch = f.get_string("general.architecture"); arch.ok() && *arch == "helios-exits") {
    load_as_sidecar(f, data, size);
    return;
  }
  auto config = model_config_from_gguf(f);
  auto spec = tokenizer_spec_from_gguf(f);
  if (spec.ok()) {
    auto tok = Tokenizer::create(*spec);
    if (tok.ok()) {
      const auto ids = (*tok)->encode("Hello world, <s> 日本\n", true, true);
      for (TokenId id : ids) {
        if (id < 0 || id >= (*tok)->n_vocab()) die("encode gave a token outside the vocabulary");
      }
      (void)(*tok)->decode(ids, true);
    }
  }
  if (!config.ok()) return;
  static const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  auto weights = load_weights(f, *config, *backend);
  (void)weights;
}

}  // namespace
}  // namespace helios::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
