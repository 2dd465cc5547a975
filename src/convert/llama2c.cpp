// llama2.c legacy checkpoint → GGUF.
//
// Checkpoint: int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}
// (vocab_size < 0: the classifier is not shared), then f32 arrays, layer-major within each kind:
// token_embedding[vocab, dim], rms_att[L, dim], wq[L, dim, dim], wk[L, kv_dim, dim],
// wv[L, kv_dim, dim], wo[L, dim, dim], rms_ffn[L, dim], w1[L, hidden, dim], w2[L, dim, hidden],
// w3[L, hidden, dim], rms_final[dim], freq_cis_real/imag[seq_len, head_dim/2] (unused), and
// wcls[vocab, dim] when not shared. Every matrix is [out, in] row-major, as GGUF stores them, and
// llama2.c's RoPE rotates adjacent pairs, as GGUF `llama` files expect: no permutation is needed.
//
// tokenizer.bin: int32 max_token_length, then per token {f32 score, int32 len, bytes}. Spaces
// were written as ' ' (SentencePiece's '▁' replaced) and BOS/EOS as "\n<s>\n" / "\n</s>\n".
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "helios/gguf.h"
#include "helios/model_tools.h"

namespace helios {
namespace {

StatusOr<std::vector<uint8_t>> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open '" + path + "'");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct Tokens {
  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<int32_t> kinds;
};

StatusOr<Tokens> read_llama2c_tokenizer(const std::string& path, int32_t n_vocab) {
  HELIOS_ASSIGN_OR_RETURN(auto bytes, read_file(path));
  size_t pos = 4;  // skip max_token_length
  Tokens t;
  auto fail = [&](const std::string& what) {
    return data_loss(path + ": token " + std::to_string(t.texts.size()) + " at offset " +
                     std::to_string(pos) + ": " + what);
  };
  if (bytes.size() < 4) return data_loss(path + ": too short for a llama2.c tokenizer");
  for (int32_t i = 0; i < n_vocab; ++i) {
    float score;
    int32_t len;
    if (bytes.size() - pos < 8) return fail("file ends (expected " + std::to_string(n_vocab) + " tokens)");
    std::memcpy(&score, &bytes[pos], 4);
    std::memcpy(&len, &bytes[pos + 4], 4);
    pos += 8;
    if (len < 0 || static_cast<size_t>(len) > bytes.size() - pos) return fail("bad length " + std::to_string(len));
    std::string text(reinterpret_cast<const char*>(&bytes[pos]), len);
    pos += len;
    int32_t kind = 1;  // normal
    if (i == 0) kind = 2;  // unknown
    if (text == "\n<s>\n") { text = "<s>"; kind = 3; }
    else if (text == "\n</s>\n") { text = "</s>"; kind = 3; }
    else if (text.size() == 6 && text.rfind("<0x", 0) == 0 && text[5] == '>') kind = 6;  // byte
    // Back to SentencePiece's spelling of a space.
    std::string piece;
    for (char ch : text) piece += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
    t.texts.push_back(piece);
    t.scores.push_back(score);
    t.kinds.push_back(kind);
  }
  return t;
}

}  // namespace

Status convert_llama2c(const std::string& checkpoint_path, const std::string& tokenizer_path,
                       const std::string& out_path) {
  HELIOS_ASSIGN_OR_RETURN(auto ckpt, read_file(checkpoint_path));
  int32_t h[7];
  if (ckpt.size() < sizeof h) return data_loss(checkpoint_path + ": too short for a llama2.c header");
  std::memcpy(h, ckpt.data(), sizeof h);
  const int32_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv_heads = h[4];
  const bool shared = h[5] > 0;
  const int32_t vocab = shared ? h[5] : -h[5], seq_len = h[6];
  if (dim <= 0 || hidden <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || vocab <= 0 ||
      seq_len <= 0 || dim % n_heads != 0 || n_heads % n_kv_heads != 0 || dim > 65536 ||
      hidden > 1 << 20 || n_layers > 1024 || vocab > 1 << 22) {
    return data_loss(checkpoint_path + ": implausible llama2.c header {dim " + std::to_string(dim) +
                     ", hidden " + std::to_string(hidden) + ", layers " + std::to_string(n_layers) +
                     ", heads " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
                     ", vocab " + std::to_string(h[5]) + ", seq_len " + std::to_string(seq_len) + "}");
  }
  const int64_t head_dim = dim / n_heads, kv_dim = head_dim * n_kv_heads;
  const int64_t L = n_layers;
  const int64_t n_floats = vocab * dim + L * dim * 2 + L * dim * dim * 2 + L * dim * kv_dim * 2 +
                           L * hidden * dim * 3 + dim + seq_len * head_dim +
                           (shared ? 0 : vocab * dim);
  if (ckpt.size() - sizeof h < static_cast<size_t>(n_floats) * 4) {
    return data_loss(checkpoint_path + ": " + std::to_string(ckpt.size()) + " bytes, the header needs " +
                     std::to_string(sizeof h + n_floats * 4));
  }
  HELIOS_ASSIGN_OR_RETURN(auto tokens, read_llama2c_tokenizer(tokenizer_path, vocab));

  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "llama2.c " + checkpoint_path.substr(checkpoint_path.find_last_of('/') + 1));
  w.set_uint32("llama.context_length", seq_len);
  w.set_uint32("llama.embedding_length", dim);
  w.set_uint32("llama.feed_forward_length", hidden);
  w.set_uint32("llama.block_count", n_layers);
  w.set_uint32("llama.attention.head_count", n_heads);
  w.set_uint32("llama.attention.head_count_kv", n_kv_heads);
  w.set_uint32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.set_float32("llama.rope.freq_base", 10000.0f);
  w.set_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens.texts);
  w.set_float32_array("tokenizer.ggml.scores", tokens.scores);
  w.set_int32_array("tokenizer.ggml.token_type", tokens.kinds);
  w.set_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.set_uint32("tokenizer.ggml.bos_token_id", 1);
  w.set_uint32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", true);

  const float* f = reinterpret_cast<const float*>(ckpt.data() + sizeof h);
  auto take = [&](int64_t n) {
    std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(f),
                               reinterpret_cast<const uint8_t*>(f + n));
    f += n;
    return bytes;
  };
  auto add = [&](const std::string& name, std::vector<int64_t> dims, std::vector<uint8_t> b) {
    return w.add_tensor(name, TensorType::kF32, dims, std::move(b));
  };
  auto per_layer = [&](const std::string& suffix, int64_t cols, int64_t rows) -> Status {
    for (int64_t l = 0; l < L; ++l) {
      std::vector<int64_t> dims = rows ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{cols};
      HELIOS_RETURN_IF_ERROR(add("blk." + std::to_string(l) + "." + suffix, dims, take(cols * (rows ? rows : 1))));
    }
    return ok_status();
  };
  HELIOS_RETURN_IF_ERROR(add("token_embd.weight", {dim, vocab}, take(int64_t{vocab} * dim)));
  HELIOS_RETURN_IF_ERROR(per_layer("attn_norm.weight", dim, 0));
  HELIOS_RETURN_IF_ERROR(per_layer("attn_q.weight", dim, dim));
  HELIOS_RETURN_IF_ERROR(per_layer("attn_k.weight", dim, kv_dim));
  HELIOS_RETURN_IF_ERROR(per_layer("attn_v.weight", dim, kv_dim));
  HELIOS_RETURN_IF_ERROR(per_layer("attn_output.weight", dim, dim));
  HELIOS_RETURN_IF_ERROR(per_layer("ffn_norm.weight", dim, 0));
  HELIOS_RETURN_IF_ERROR(per_layer("ffn_gate.weight", dim, hidden));
  HELIOS_RETURN_IF_ERROR(per_layer("ffn_down.weight", hidden, dim));
  HELIOS_RETURN_IF_ERROR(per_layer("ffn_up.weight", dim, hidden));
  HELIOS_RETURN_IF_ERROR(add("output_norm.weight", {dim}, take(dim)));
  f += seq_len * head_dim;  // legacy freq_cis_real + freq_cis_imag
  if (!shared) HELIOS_RETURN_IF_ERROR(add("output.weight", {dim, vocab}, take(int64_t{vocab} * dim)));
  return w.write(out_path);
}

}  // namespace helios
