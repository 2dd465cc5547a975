// Model hyper-parameters read from GGUF metadata (never from the server's YAML).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "helios/status.h"

namespace helios {

class GgufFile;

// How RoPE pairs the dimensions of a head.
enum class RopeLayout {
  kInterleaved,  // (x[2i], x[2i+1]): llama.cpp's "norm" rope, used by GGUF `llama` files
  kHalves,       // (x[i], x[i + n_rot/2]): GPT-NeoX / Hugging Face layout
};

// A rope scaling as a file states it (rope.scaling.type, .factor, .original_context_length), or as
// an operator sets it for a file without it: Qwen2.5's long-context recipe is {yarn, 4, 32768}.
struct RopeScaling {
  std::string type = "none";     // none, linear or yarn
  double factor = 1.0;           // the scaled angles times 1 / factor; 0 or 1: no scaling
  int32_t original_context = 0;  // yarn: the context it extends; 0: the file's context_length

  // INVALID_ARGUMENT naming the field when the type is unknown or a number out of range.
  Status validate() const;
};

struct ModelConfig {
  std::string architecture;  // "llama" or "qwen2"
  std::string name;          // general.name, for display
  int32_t n_layer = 0;       // transformer blocks
  int32_t n_embd = 0;        // hidden size
  int32_t n_head = 0;        // query heads
  int32_t n_head_kv = 0;     // key/value heads (GQA when < n_head)
  int32_t head_dim = 0;      // n_embd / n_head
  int32_t n_ff = 0;          // SwiGLU inner size
  int32_t n_vocab = 0;
  // The context the model serves: the file's context_length, or YaRN's original context times its
  // factor where that is larger (as vLLM derives it).
  int32_t n_ctx_train = 0;
  int32_t n_rot = 0;         // rotary dimensions per head (≤ head_dim)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear and YaRN scaling: angles times this (1 / the file's factor)
  // YaRN (kernels::RopeParams): how much of the unscaled angle pairs keep, ramping from all of it at
  // pair rope_yarn_low to none at rope_yarn_high; 0: no YaRN.
  float rope_yarn_ext_factor = 0.0f;
  float rope_yarn_low = 0.0f, rope_yarn_high = 0.0f;
  float rope_mscale = 1.0f;  // cos and sin times this: YaRN's temperature × rope.scaling.attn_factor
  RopeScaling rope_scaling;  // as read or set; the fields above follow from it
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  float rms_eps = 1e-5f;
  bool tied_output = false;  // LM head shares the token embedding

  int32_t q_dim() const { return n_head * head_dim; }
  int32_t kv_dim() const { return n_head_kv * head_dim; }
};

// The architectures Helios runs, for error messages.
inline constexpr const char* kSupportedArchitectures =
    "llama (Llama 2/3, SmolLM/SmolLM2, Mistral-style), qwen2 (Qwen2, Qwen2.5, Qwen2.5-Coder)";

// Reads `<arch>.*` keys (`qwen2` is `llama` with Q/K/V biases, which the weights carry, and
// NeoX-style RoPE, as llama.cpp runs it); refuses other architectures and inconsistent shapes
// with a message that names the key and value. rope_scaling, when given, replaces the file's.
StatusOr<ModelConfig> model_config_from_gguf(const GgufFile& file,
                                             const std::optional<RopeScaling>& rope_scaling = std::nullopt);

}  // namespace helios
