// helios inspect: what is inside a GGUF file.
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "helios/gguf.h"
#include "helios/model_config.h"

namespace helios::cli {

int cmd_inspect(int argc, char** argv) {
  Args args("inspect", "Shows a GGUF file's metadata, tensor table, parameter count and bytes.", "PATH");
  args.option("tensors", "N", "list at most N tensors; 0 = none", "all")
      .example("helios inspect models/SmolLM2-135M-Instruct.Q4_1.gguf --tensors 12");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("inspect", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (args.positional().size() != 1) return usage_error("inspect", "expected one GGUF file path (see --help)");
  int64_t max_tensors = -1;
  if (args.str("tensors") != "all") {
    auto n = args.integer("tensors");
    if (!n.ok()) return usage_error("inspect", n.status().message());
    max_tensors = *n;
  }

  auto file = GgufFile::open(args.positional()[0]);
  if (!file.ok()) return fail("inspect", file.status());
  const GgufFile& f = **file;
  std::printf("file: %s\nGGUF version %u, %llu bytes, alignment %llu\n\nmetadata (%zu keys):\n",
              f.path().c_str(), f.version(), static_cast<unsigned long long>(f.file_size()),
              static_cast<unsigned long long>(f.alignment()), f.keys().size());
  for (const auto& key : f.keys()) {
    std::printf("  %-42s %s\n", key.c_str(), f.find(key)->to_display_string().c_str());
  }

  int64_t n_params = 0;
  uint64_t n_bytes = 0;
  std::map<std::string, int> by_type;
  for (const auto& t : f.tensors()) {
    n_params += t.n_elements();
    n_bytes += t.n_bytes;
    ++by_type[tensor_type_name(t.type)];
  }
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  int64_t shown = 0;
  for (const auto& t : f.tensors()) {
    if (max_tensors >= 0 && shown++ >= max_tensors) break;
    std::string shape;
    for (size_t i = 0; i < t.dims.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.dims[i]);
    std::printf("  %-32s %-6s %-18s %12llu bytes\n", t.name.c_str(), tensor_type_name(t.type),
                shape.c_str(), static_cast<unsigned long long>(t.n_bytes));
  }
  if (max_tensors >= 0 && static_cast<int64_t>(f.tensors().size()) > max_tensors) {
    std::printf("  … %zu more\n", f.tensors().size() - static_cast<size_t>(max_tensors));
  }
  std::printf("\nparameters: %lld (%.1fM)\ntensor bytes: %llu (%.1f MiB)\ntypes:",
              static_cast<long long>(n_params), n_params / 1e6,
              static_cast<unsigned long long>(n_bytes), n_bytes / 1048576.0);
  for (const auto& [type, count] : by_type) std::printf(" %s×%d", type.c_str(), count);
  std::printf("\n");
  auto config = model_config_from_gguf(f);
  if (config.ok()) {
    const ModelConfig& c = *config;
    std::printf("model: %s, %d layers, embd %d, heads %d/%d (head dim %d), ffn %d, vocab %d, "
                "context %d, rope base %g, %s LM head\n",
                c.architecture.c_str(), c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim,
                c.n_ff, c.n_vocab, c.n_ctx_train, c.rope_freq_base, c.tied_output ? "tied" : "separate");
    if (const RopeScaling& r = c.rope_scaling; r.type != "none" || c.rope_mscale != 1.0f) {
      std::printf("rope scaling: %s", r.type == "yarn" ? "YaRN" : r.type.c_str());
      if (r.type != "none") std::printf(" by %g", r.factor);
      if (r.type == "yarn") {
        std::printf(" (pairs up to %g keep their angle, from %g on scaled)", c.rope_yarn_low, c.rope_yarn_high);
      }
      std::printf(", cos and sin times %g\n", c.rope_mscale);
    }
  } else {
    std::printf("model: not runnable by Helios: %s\n", config.status().message().c_str());
  }
  return 0;
}

}  // namespace helios::cli
