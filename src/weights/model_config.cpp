// GGUF metadata → ModelConfig.
#include <algorithm>
#include <cmath>
#include <string>

#include "helios/gguf.h"
#include "helios/model_config.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

StatusOr<int32_t> get_positive(const GgufFile& f, const std::string& key, int64_t max_value) {
  auto v = f.get_uint(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > static_cast<uint64_t>(max_value)) {
    return invalid_argument(f.path() + ": metadata '" + key + "' = " + std::to_string(*v) +
                            " is out of range (1.." + std::to_string(max_value) + ")");
  }
  return static_cast<int32_t>(*v);
}

// The rope scaling a file asks for, as llama.cpp reads it for `llama` and `qwen2` files: the kind
// from rope.scaling.type (linear when absent), the factor from rope.scaling.factor (else the older
// rope.scale_linear), and YaRN's original context. LongRoPE and other kinds are not implemented:
// such a file would give other logits than its model was trained to, so it is refused rather than
// run without them. (Llama 3's per-pair divisors, the tensor rope_freqs.weight, are applied too:
// ModelWeights::rope_freqs.)
StatusOr<RopeScaling> read_rope_scaling(const GgufFile& f, const std::string& a) {
  RopeScaling r;
  auto factor = f.get_float(a + "rope.scaling.factor");
  if (!factor.ok()) factor = f.get_float(a + "rope.scale_linear");
  if (factor.ok()) r.factor = *factor;
  if (r.factor == 0.0 || r.factor == 1.0) return RopeScaling{};  // scales nothing, whatever the kind
  auto type = f.get_string(a + "rope.scaling.type");
  r.type = type.ok() ? *type : "linear";  // rope.scale_linear alone is linear
  if (r.type == "none") return RopeScaling{};
  if (r.type != "linear" && r.type != "yarn") {
    return invalid_argument(f.path() + ": rope scaling '" + r.type + "' (factor " + std::to_string(r.factor) +
                            ") is not supported yet; supported: linear, yarn, and Llama 3's rope_freqs. Use a "
                            "model without it (Llama 2/3/3.1/3.2, SmolLM2, Qwen2.5 as converted by llama.cpp)");
  }
  if (f.find(a + "rope.scaling.original_context_length")) {
    HELIOS_ASSIGN_OR_RETURN(r.original_context, get_positive(f, a + "rope.scaling.original_context_length", 1 << 24));
  }
  if (!(r.factor > 0.0)) {
    return invalid_argument(f.path() + ": rope scaling factor must be > 0, got " + std::to_string(r.factor));
  }
  return r;
}

// What a scaling does to the rotation, as llama.cpp computes it. Linear multiplies every angle by
// 1 / factor (rope_freq_scale). YaRN does so for the slow pairs only, ramping to the unscaled
// angle over its correction range, raises cos and sin by 1 + 0.1 ln(factor), and serves its
// original context times the factor. rope_mscale holds the file's attn_factor on the way in.
void apply_rope_scaling(const RopeScaling& r, ModelConfig& c) {
  c.rope_scaling = r;
  if (r.type == "none" || r.factor == 0.0 || r.factor == 1.0) return;
  c.rope_freq_scale = 1.0f / static_cast<float>(r.factor);  // as llama.cpp: a float reciprocal
  if (r.type != "yarn") return;

  // llama.cpp's defaults for these architectures: full mix, beta_fast 32, beta_slow 1.
  const int32_t n_ctx_orig = r.original_context > 0 ? r.original_context : c.n_ctx_train;
  kernels::RopeParams range{.n_rot = c.n_rot, .freq_base = c.rope_freq_base};
  kernels::yarn_correction_range(n_ctx_orig, 32.0f, 1.0f, range);
  c.rope_yarn_ext_factor = 1.0f;
  c.rope_yarn_low = range.corr_low;
  c.rope_yarn_high = range.corr_high;
  // llama.cpp's temperature, in its float steps: (1 + 0.1 ln f) times its reciprocal (which the
  // rope kernel's own factor then restores), times the kernel's 1 + 0.1 ln f.
  const float f_scale = 1.0f / c.rope_freq_scale;
  const float temperature = f_scale <= 1.0f ? 1.0f : 0.1f * std::log(f_scale) + 1.0f;
  c.rope_mscale *= temperature * (1.0f / (1.0f + 0.1f * std::log(f_scale)));
  c.rope_mscale *= 1.0f + 0.1f * std::log(f_scale);
  const double extended = static_cast<double>(n_ctx_orig) * r.factor;
  c.n_ctx_train = static_cast<int32_t>(std::clamp(extended, static_cast<double>(c.n_ctx_train), double{1 << 24}));
}

}  // namespace

Status RopeScaling::validate() const {
  if (type != "none" && type != "linear" && type != "yarn") {
    return invalid_argument("rope_scaling.type: '" + type + "' is not one of none, linear, yarn");
  }
  if (!(factor > 0.0) || !std::isfinite(factor)) {
    return invalid_argument("rope_scaling.factor must be a number > 0 (e.g. 4), got " + std::to_string(factor));
  }
  if (original_context < 0) {
    return invalid_argument("rope_scaling.original_context must be >= 0 (0: the model's context_length), got " +
                            std::to_string(original_context));
  }
  return ok_status();
}

StatusOr<ModelConfig> model_config_from_gguf(const GgufFile& f, const std::optional<RopeScaling>& rope_scaling) {
  ModelConfig c;
  HELIOS_ASSIGN_OR_RETURN(c.architecture, f.get_string("general.architecture"));
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    return invalid_argument(f.path() + ": architecture '" + c.architecture +
                            "' is not supported; supported: " + kSupportedArchitectures);
  }
  auto name = f.get_string("general.name");
  c.name = name.ok() ? *name : "";
  const std::string a = c.architecture + ".";
  HELIOS_ASSIGN_OR_RETURN(c.n_layer, get_positive(f, a + "block_count", 1024));
  HELIOS_ASSIGN_OR_RETURN(c.n_embd, get_positive(f, a + "embedding_length", 1 << 16));
  HELIOS_ASSIGN_OR_RETURN(c.n_head, get_positive(f, a + "attention.head_count", 1024));
  c.n_head_kv = c.n_head;
  if (f.find(a + "attention.head_count_kv")) {
    HELIOS_ASSIGN_OR_RETURN(c.n_head_kv, get_positive(f, a + "attention.head_count_kv", 1024));
  }
  HELIOS_ASSIGN_OR_RETURN(c.n_ff, get_positive(f, a + "feed_forward_length", 1 << 20));
  HELIOS_ASSIGN_OR_RETURN(c.n_ctx_train, get_positive(f, a + "context_length", 1 << 24));
  if (c.n_embd % c.n_head != 0) {
    return invalid_argument(f.path() + ": embedding_length " + std::to_string(c.n_embd) +
                            " is not a multiple of head_count " + std::to_string(c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return invalid_argument(f.path() + ": head_count " + std::to_string(c.n_head) +
                            " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv));
  }
  c.head_dim = c.n_embd / c.n_head;
  c.n_rot = c.head_dim;
  if (f.find(a + "rope.dimension_count")) {
    HELIOS_ASSIGN_OR_RETURN(c.n_rot, get_positive(f, a + "rope.dimension_count", c.head_dim));
    if (c.n_rot % 2 != 0) return invalid_argument(f.path() + ": rope.dimension_count must be even");
  }
  if (f.find(a + "rope.freq_base")) {
    HELIOS_ASSIGN_OR_RETURN(double base, f.get_float(a + "rope.freq_base"));
    if (!(base > 1.0)) return invalid_argument(f.path() + ": rope.freq_base must be > 1");
    c.rope_freq_base = static_cast<float>(base);
  }
  if (f.find(a + "rope.scaling.attn_factor")) {  // llama.cpp applies it whatever the scaling
    HELIOS_ASSIGN_OR_RETURN(double attn, f.get_float(a + "rope.scaling.attn_factor"));
    if (!(attn > 0.0)) return invalid_argument(f.path() + ": rope.scaling.attn_factor must be > 0");
    c.rope_mscale = static_cast<float>(attn);
  }
  if (rope_scaling) {
    HELIOS_RETURN_IF_ERROR(rope_scaling->validate());
    apply_rope_scaling(*rope_scaling, c);
  } else {
    HELIOS_ASSIGN_OR_RETURN(const RopeScaling r, read_rope_scaling(f, a));
    apply_rope_scaling(r, c);
  }
  if (f.find(a + "attention.layer_norm_rms_epsilon")) {
    HELIOS_ASSIGN_OR_RETURN(double eps, f.get_float(a + "attention.layer_norm_rms_epsilon"));
    if (!(eps > 0 && eps < 1)) return invalid_argument(f.path() + ": layer_norm_rms_epsilon must be in (0, 1)");
    c.rms_eps = static_cast<float>(eps);
  }
  // `llama` GGUF files store Q/K already permuted for interleaved pairs; `qwen2` files keep the
  // Hugging Face order, which llama.cpp rotates NeoX-style (pairs half a rotation apart). A file
  // may say otherwise.
  if (c.architecture == "qwen2") c.rope_layout = RopeLayout::kHalves;
  if (auto layout = f.get_string("helios.rope.layout"); layout.ok()) {
    if (*layout == "halves") c.rope_layout = RopeLayout::kHalves;
    else if (*layout == "interleaved") c.rope_layout = RopeLayout::kInterleaved;
    else {
      return invalid_argument(f.path() + ": helios.rope.layout '" + *layout + "' (valid: interleaved, halves)");
    }
  }
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) return invalid_argument(f.path() + ": tensor 'token_embd.weight' is missing");
  if (embd->dims.size() != 2) return invalid_argument(f.path() + ": token_embd.weight must be 2-D");
  c.n_vocab = static_cast<int32_t>(embd->dims[1]);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace helios
