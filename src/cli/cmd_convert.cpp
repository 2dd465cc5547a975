// helios convert-llama2c and helios make-synthetic: write GGUF models.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "helios/model_tools.h"

namespace helios::cli {

int cmd_convert_llama2c(int argc, char** argv) {
  Args args("convert-llama2c",
            "Converts a llama2.c checkpoint (legacy format) and its tokenizer.bin into a GGUF\n"
            "model with its tokenizer, which then runs like any other model.");
  args.option("checkpoint", "PATH", "llama2.c checkpoint, e.g. stories260K.bin")
      .option("tokenizer", "PATH", "llama2.c tokenizer, e.g. tok512.bin")
      .option("out", "PATH", "GGUF file to write")
      .example("helios convert-llama2c --checkpoint ../shared/data/models/stories260K/stories260K.bin \\\n"
               "      --tokenizer ../shared/data/models/stories260K/tok512.bin --out models/stories260K.gguf");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("convert-llama2c", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  for (const char* required : {"checkpoint", "tokenizer", "out"}) {
    if (!args.has(required)) {
      return usage_error("convert-llama2c", std::string("--") + required + " is required (see --help)");
    }
  }
  Status s = convert_llama2c(args.str("checkpoint"), args.str("tokenizer"), args.str("out"));
  if (!s.ok()) return fail("convert-llama2c", s);
  std::fprintf(stderr, "wrote %s\n", args.str("out").c_str());
  return 0;
}

int cmd_make_synthetic(int argc, char** argv) {
  Args args("make-synthetic",
            "Writes a model with seeded random weights, for tests and for benchmarking shapes\n"
            "that cannot be downloaded. A preset sets the shape; explicit options override it.\n"
            "presets: tiny (2 layers, 64 wide), 1b (Llama-3.2-1B-like: 16 x 2048, ffn 8192,\n"
            "32/8 heads, vocab 32000), 7b (Llama-2-7B: 32 x 4096, ffn 11008, 32 heads),\n"
            "8b (Llama-3-8B: 32 x 4096, ffn 14336, 32/8 heads, vocab 128256).");
  args.option("out", "PATH", "GGUF file to write (required)")
      .option("preset", "NAME", "tiny, 1b, 7b or 8b", "tiny")
      .option("layers", "N", "transformer blocks")
      .option("embd", "N", "hidden size")
      .option("heads", "N", "attention heads")
      .option("kv-heads", "N", "key/value heads (GQA when fewer than heads)")
      .option("ffn", "N", "feed-forward size")
      .option("vocab", "N", "vocabulary size (>= 259)")
      .option("ctx", "N", "context length")
      .option("type", "T",
              "matrix type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, or Q4_K_M\n"
              "(Q4_K with Q6_K for the LM head and some attn_v/ffn_down, as llama.cpp's Q4_K_M)",
              "F16")
      .option("seed", "S", "random seed", "1")
      .option("untied", "", "write a separate LM head instead of sharing the embedding")
      .option("rope-halves", "", "use the (i, i + d/2) RoPE pairing instead of interleaved pairs")
      .option("rope-base", "F", "RoPE frequency base (preset's: 10000, or 500000 for 1b and 8b)")
      .option("llama3-rope", "", "write rope_freqs.weight: Llama 3.1's rope scaling for this shape")
      .option("rope-linear", "F", "linear rope scaling by factor F (rope.scaling.type = linear)")
      .option("rope-yarn", "F", "YaRN rope scaling by factor F (rope.scaling.type = yarn)")
      .option("rope-original-ctx", "N", "the context YaRN extends (rope.scaling.original_context_length)")
      .option("rope-attn-factor", "F", "cos and sin of every angle times F (rope.scaling.attn_factor)")
      .example("helios make-synthetic --preset 1b --type Q8_0 --out models/synthetic-1b.gguf");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("make-synthetic", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("out")) return usage_error("make-synthetic", "--out PATH is required (see --help)");

  SyntheticModelSpec spec;
  const std::string preset = args.str("preset");
  if (preset == "1b") {
    spec = {16, 2048, 32, 8, 8192, 32000, 4096, 500000.0f};
  } else if (preset == "7b") {
    spec = {32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f};
  } else if (preset == "8b") {
    spec = {32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f};
  } else if (preset != "tiny") {
    return usage_error("make-synthetic", "unknown --preset '" + preset + "' (valid: tiny, 1b, 7b, 8b)");
  }
  spec.name = "synthetic-" + preset;
  auto override_int = [&](const char* name, int32_t* field) -> Status {
    if (!args.has(name)) return ok_status();
    HELIOS_ASSIGN_OR_RETURN(int64_t v, args.integer(name));
    *field = static_cast<int32_t>(v);
    return ok_status();
  };
  auto parse_all = [&]() -> Status {
    HELIOS_RETURN_IF_ERROR(override_int("layers", &spec.n_layer));
    HELIOS_RETURN_IF_ERROR(override_int("embd", &spec.n_embd));
    HELIOS_RETURN_IF_ERROR(override_int("heads", &spec.n_head));
    HELIOS_RETURN_IF_ERROR(override_int("kv-heads", &spec.n_head_kv));
    HELIOS_RETURN_IF_ERROR(override_int("ffn", &spec.n_ff));
    HELIOS_RETURN_IF_ERROR(override_int("vocab", &spec.n_vocab));
    HELIOS_RETURN_IF_ERROR(override_int("ctx", &spec.n_ctx));
    HELIOS_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed"));
    spec.seed = static_cast<uint64_t>(seed);
    spec.q4_k_m = args.str("type") == "Q4_K_M" || args.str("type") == "q4_k_m";
    auto type = spec.q4_k_m ? TensorType::kQ4_K : tensor_type_from_name(args.str("type"));
    if (!type) return invalid_argument("unknown --type '" + args.str("type") + "'");
    spec.type = *type;
    spec.tied_output = !args.has("untied");
    spec.rope_halves = args.has("rope-halves");
    spec.llama3_rope = args.has("llama3-rope");
    if (args.has("rope-linear") && args.has("rope-yarn")) {
      return invalid_argument("--rope-linear and --rope-yarn exclude each other: a model has one rope scaling");
    }
    for (const char* kind : {"linear", "yarn"}) {
      const std::string option = std::string("rope-") + kind;
      if (!args.has(option)) continue;
      HELIOS_ASSIGN_OR_RETURN(double factor, args.number(option));
      if (!(factor >= 1.0)) return invalid_argument("--" + option + " must be >= 1, got " + args.str(option));
      spec.rope_scaling = kind;
      spec.rope_scaling_factor = static_cast<float>(factor);
    }
    HELIOS_RETURN_IF_ERROR(override_int("rope-original-ctx", &spec.rope_original_ctx));
    if (args.has("rope-attn-factor")) {
      HELIOS_ASSIGN_OR_RETURN(double attn, args.number("rope-attn-factor"));
      if (!(attn > 0.0)) return invalid_argument("--rope-attn-factor must be > 0, got " + args.str("rope-attn-factor"));
      spec.rope_attn_factor = static_cast<float>(attn);
    }
    if (args.has("rope-base")) {
      HELIOS_ASSIGN_OR_RETURN(double base, args.number("rope-base"));
      if (!(base > 1.0)) return invalid_argument("--rope-base must be > 1, got " + args.str("rope-base"));
      spec.rope_freq_base = static_cast<float>(base);
    }
    return spec.validate();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("make-synthetic", s.message());

  std::fprintf(stderr, "writing %s: %.1fM parameters, %s\n", args.str("out").c_str(),
               spec.n_params() / 1e6, tensor_type_name(spec.type));
  Status s = make_synthetic_model(spec, args.str("out"), [](int done, int total) {
    std::fprintf(stderr, "\r  tensor %d/%d", done, total);
    if (done == total) std::fputc('\n', stderr);
  });
  if (!s.ok()) return fail("make-synthetic", s);
  std::fprintf(stderr, "wrote %s\n", args.str("out").c_str());
  return 0;
}

}  // namespace helios::cli
