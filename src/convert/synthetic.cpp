// Seeded random-weight models of any shape, for tests and for benchmarking shapes we cannot
// download. Each tensor draws from its own RNG stream (seed, tensor index), so the weights do
// not depend on the order tensors are written in.
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "helios/gguf.h"
#include "helios/model_tools.h"

namespace helios {
namespace {

// Llama 3.1's rope_freqs for head_dim and base (factor 8, low/high frequency factors 1 and 4,
// original context 8192), computed in double as llama.cpp's converter does: pairs whose
// wavelength is under 8192/4 keep their frequency, over 8192 divide it by 8, and between blend.
std::vector<float> llama3_rope_factors(int32_t head_dim, float base) {
  constexpr double kFactor = 8, kLow = 1, kHigh = 4, kOldContext = 8192;
  constexpr double kPi = 3.14159265358979323846;
  std::vector<float> out;
  for (int32_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(base), static_cast<double>(i) / head_dim);
    const double wavelen = 2 * kPi / freq;
    if (wavelen < kOldContext / kHigh) {
      out.push_back(1.0f);
    } else if (wavelen > kOldContext / kLow) {
      out.push_back(static_cast<float>(kFactor));
    } else {
      const double smooth = (kOldContext / wavelen - kLow) / (kHigh - kLow);
      out.push_back(static_cast<float>(1 / ((1 - smooth) / kFactor + smooth)));
    }
  }
  return out;
}

}  // namespace

Status SyntheticModelSpec::validate() const {
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v <= 0) return invalid_argument(std::string(name) + " must be > 0 (got " + std::to_string(v) + ")");
    return ok_status();
  };
  HELIOS_RETURN_IF_ERROR(positive(n_layer, "layers"));
  HELIOS_RETURN_IF_ERROR(positive(n_embd, "embedding size"));
  HELIOS_RETURN_IF_ERROR(positive(n_head, "heads"));
  HELIOS_RETURN_IF_ERROR(positive(n_head_kv, "kv heads"));
  HELIOS_RETURN_IF_ERROR(positive(n_ff, "ffn size"));
  HELIOS_RETURN_IF_ERROR(positive(n_ctx, "context"));
  if (n_vocab < 259) return invalid_argument("vocab must be ≥ 259 (unk, bos, eos and 256 byte tokens)");
  if (n_embd % n_head != 0) return invalid_argument("embedding size must be a multiple of heads");
  if (n_head % n_head_kv != 0) return invalid_argument("heads must be a multiple of kv heads");
  if ((n_embd / n_head) % 2 != 0) return invalid_argument("head size (embedding / heads) must be even");
  if (rope_scaling != "linear" && rope_scaling != "yarn") {
    return invalid_argument("rope scaling '" + rope_scaling + "' (valid: linear, yarn)");
  }
  if (rope_original_ctx < 0) return invalid_argument("the rope's original context must be > 0");
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  if (!traits || !traits->can_dequantize) return invalid_argument("unsupported tensor type");
  if (q4_k_m && type != TensorType::kQ4_K) return invalid_argument("the Q4_K_M mix is for type Q4_K");
  const int64_t b = traits->block_elems;
  if (n_embd % b != 0 || n_ff % b != 0) {
    return invalid_argument(std::string(traits->name) + " needs embedding and ffn sizes that are multiples of " +
                            std::to_string(b));
  }
  return ok_status();
}

int64_t SyntheticModelSpec::n_params() const {
  const int64_t kv_dim = int64_t{n_embd} / n_head * n_head_kv;
  const int64_t layer = 2LL * n_embd * n_embd + 2LL * n_embd * kv_dim + 3LL * n_embd * n_ff + 2LL * n_embd;
  return n_layer * layer + int64_t{n_vocab} * n_embd * (tied_output ? 1 : 2) + n_embd;
}

Status make_synthetic_model(const SyntheticModelSpec& s, const std::string& out_path,
                            const std::function<void(int, int)>& progress) {
  HELIOS_RETURN_IF_ERROR(s.validate());
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", s.name);
  w.set_uint32("llama.context_length", s.n_ctx);
  w.set_uint32("llama.embedding_length", s.n_embd);
  w.set_uint32("llama.feed_forward_length", s.n_ff);
  w.set_uint32("llama.block_count", s.n_layer);
  w.set_uint32("llama.attention.head_count", s.n_head);
  w.set_uint32("llama.attention.head_count_kv", s.n_head_kv);
  w.set_uint32("llama.rope.dimension_count", s.n_embd / s.n_head);
  w.set_float32("llama.rope.freq_base", s.rope_freq_base);
  if (s.rope_scaling_factor > 1.0f) {
    w.set_string("llama.rope.scaling.type", s.rope_scaling);
    w.set_float32("llama.rope.scaling.factor", s.rope_scaling_factor);
  }
  if (s.rope_original_ctx > 0) w.set_uint32("llama.rope.scaling.original_context_length", s.rope_original_ctx);
  if (s.rope_attn_factor > 0.0f) w.set_float32("llama.rope.scaling.attn_factor", s.rope_attn_factor);
  w.set_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (s.rope_halves) w.set_string("helios.rope.layout", "halves");

  // Vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then filler pieces.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> kinds = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    kinds.push_back(6);
  }
  while (static_cast<int32_t>(tokens.size()) < s.n_vocab) {
    tokens.push_back("\xE2\x96\x81tok" + std::to_string(tokens.size()));
    kinds.push_back(1);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_float32_array("tokenizer.ggml.scores", scores);
  w.set_int32_array("tokenizer.ggml.token_type", kinds);
  w.set_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.set_uint32("tokenizer.ggml.bos_token_id", 1);
  w.set_uint32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);

  int n_added = 0;
  int n_total = 0;
  int n_written = 0;
  // llama.cpp's use_more_bits(layer, n_layer) for Q4_K_M.
  auto more_bits = [&](int32_t l) {
    return l < s.n_layer / 8 || l >= 7 * s.n_layer / 8 || (l - s.n_layer / 8) % 3 == 2;
  };
  auto matrix_type = [&](const std::string& name) {
    if (!s.q4_k_m) return s.type;
    const bool head = name == "output.weight" || (name == "token_embd.weight" && s.tied_output);
    if (head) return TensorType::kQ6_K;
    for (const char* part : {".attn_v.", ".ffn_down."}) {
      if (name.find(part) != std::string::npos && more_bits(std::stoi(name.substr(4)))) return TensorType::kQ6_K;
    }
    return s.type;
  };
  auto add = [&](const std::string& name, int64_t cols, int64_t rows) -> Status {
    const bool is_norm = rows == 0;
    const TensorType type = is_norm ? TensorType::kF32 : matrix_type(name);
    const uint64_t stream = s.seed * 1000003ULL + static_cast<uint64_t>(n_added++);
    const std::vector<int64_t> dims = is_norm ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    ++n_total;
    return w.add_tensor_lazy(name, type, dims, [=, &progress, &n_written, &n_total] {
      const int64_t n_rows = is_norm ? 1 : rows;
      std::vector<uint8_t> bytes(static_cast<size_t>(tensor_row_bytes(type, cols) * n_rows));
      std::vector<float> row(cols);
      std::mt19937_64 rng(stream);
      std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
      for (int64_t r = 0; r < n_rows; ++r) {
        for (auto& x : row) x = is_norm ? 1.0f : normal(rng);
        Status st = quantize_row(type, row.data(), bytes.data() + r * tensor_row_bytes(type, cols), cols);
        assert(st.ok());
      }
      if (progress) progress(++n_written, n_total);
      return bytes;
    });
  };
  const int64_t kv_dim = int64_t{s.n_embd} / s.n_head * s.n_head_kv;
  HELIOS_RETURN_IF_ERROR(add("token_embd.weight", s.n_embd, s.n_vocab));
  for (int32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    HELIOS_RETURN_IF_ERROR(add(p + "attn_norm.weight", s.n_embd, 0));
    HELIOS_RETURN_IF_ERROR(add(p + "attn_q.weight", s.n_embd, s.n_embd));
    HELIOS_RETURN_IF_ERROR(add(p + "attn_k.weight", s.n_embd, kv_dim));
    HELIOS_RETURN_IF_ERROR(add(p + "attn_v.weight", s.n_embd, kv_dim));
    HELIOS_RETURN_IF_ERROR(add(p + "attn_output.weight", s.n_embd, s.n_embd));
    HELIOS_RETURN_IF_ERROR(add(p + "ffn_norm.weight", s.n_embd, 0));
    HELIOS_RETURN_IF_ERROR(add(p + "ffn_gate.weight", s.n_embd, s.n_ff));
    HELIOS_RETURN_IF_ERROR(add(p + "ffn_up.weight", s.n_embd, s.n_ff));
    HELIOS_RETURN_IF_ERROR(add(p + "ffn_down.weight", s.n_ff, s.n_embd));
  }
  HELIOS_RETURN_IF_ERROR(add("output_norm.weight", s.n_embd, 0));
  if (!s.tied_output) HELIOS_RETURN_IF_ERROR(add("output.weight", s.n_embd, s.n_vocab));
  if (s.llama3_rope) {  // last, so that every other tensor keeps the values it has without it
    const std::vector<float> f = llama3_rope_factors(s.n_embd / s.n_head, s.rope_freq_base);
    std::vector<uint8_t> bytes(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
    HELIOS_RETURN_IF_ERROR(w.add_tensor("rope_freqs.weight", TensorType::kF32, {static_cast<int64_t>(f.size())},
                                        std::move(bytes)));
  }
  return w.write(out_path);
}

}  // namespace helios
