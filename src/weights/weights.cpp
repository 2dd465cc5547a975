// GGUF tensors → backend buffers, with their shapes checked against the model config.
// Matrices keep their quantized type where the backend multiplies with it, and the embedding
// table where the backend gathers rows from it; the rest is f32.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "helios/gguf.h"
#include "helios/weights.h"

namespace helios {
namespace {

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

StatusOr<const GgufTensorInfo*> find_checked(const GgufFile& file, const std::string& name,
                                            int64_t n_cols, int64_t n_rows) {
  const GgufTensorInfo* t = file.find_tensor(name);
  if (!t) return invalid_argument(file.path() + ": tensor '" + name + "' is missing");
  const std::vector<int64_t> want = n_rows ? std::vector<int64_t>{n_cols, n_rows}
                                           : std::vector<int64_t>{n_cols};
  if (t->dims != want) {
    return invalid_argument(file.path() + ": tensor '" + name + "' has shape " +
                            shape_string(t->dims) + ", expected " + shape_string(want));
  }
  return t;
}

StatusOr<Buffer> upload(Backend& backend, const std::string& name, const void* data, size_t n_bytes) {
  const size_t n_floats = (n_bytes + sizeof(float) - 1) / sizeof(float);
  Buffer buf(&backend, n_floats);
  if (buf.empty()) {
    return resource_exhausted("out of " + backend.name() + " memory loading '" + name + "' (" +
                              std::to_string(n_bytes) + " bytes)");
  }
  // upload() copies whole floats: the bytes go as they are, and a ragged tail through a padded float.
  const size_t n_whole = n_bytes / sizeof(float);
  backend.upload(buf.data(), static_cast<const float*>(data), n_whole);
  if (n_whole < n_floats) {
    float tail = 0.0f;
    std::memcpy(&tail, static_cast<const uint8_t*>(data) + n_whole * sizeof(float), n_bytes - n_whole * sizeof(float));
    backend.upload(buf.data() + n_whole, &tail, 1);
  }
  return buf;
}

// Dequantizes tensor `name` (GGUF dims {n_cols, n_rows}, or {n_cols} when n_rows is 0) into
// backend memory as n_rows rows of n_cols floats.
StatusOr<Buffer> load_f32(const GgufFile& file, Backend& backend, const std::string& name,
                          int64_t n_cols, int64_t n_rows) {
  HELIOS_ASSIGN_OR_RETURN(const GgufTensorInfo* t, find_checked(file, name, n_cols, n_rows));
  const int64_t rows = n_rows ? n_rows : 1;
  std::vector<float> host(static_cast<size_t>(rows * n_cols));
  const int64_t row_bytes = tensor_row_bytes(t->type, n_cols);
  for (int64_t r = 0; r < rows; ++r) {
    Status s = dequantize_row(t->type, t->data + r * row_bytes, host.data() + r * n_cols, n_cols);
    if (!s.ok()) return invalid_argument(file.path() + ": tensor '" + name + "': " + s.message());
  }
  return upload(backend, name, host.data(), host.size() * sizeof(float));
}

// The type a matrix of the file's type `type` gets in backend memory: its own when the backend
// multiplies with it (or, for the embedding table, gathers rows from it), else F32.
TensorType kept_type(const Backend& backend, TensorType type, bool embedding) {
  const bool keep = embedding ? backend.supports_embedding_type(type) : backend.supports_weight_type(type);
  return keep ? type : TensorType::kF32;
}

// What a matrix is loaded for: matmul(), embedding_rows(), or both (a tied LM head).
enum class Use { kMatmul, kEmbedding, kTiedEmbedding };

// The layout a matrix keeps in backend memory: the backend's for matmul(), GGUF's rows for an
// embedding table alone (rows are gathered from it) and for anything dequantized. A table tied
// to the LM head takes the head's layout where both keep the same type, so one copy serves both.
WeightLayout kept_layout(const Backend& backend, TensorType type, int64_t n_cols, int64_t n_rows, Use use) {
  if (kept_type(backend, type, false) != type) return WeightLayout::kRows;
  if (use == Use::kEmbedding || (use == Use::kTiedEmbedding && !backend.supports_embedding_type(type))) {
    return WeightLayout::kRows;
  }
  return backend.matmul_layout(type, static_cast<int32_t>(n_rows), static_cast<int32_t>(n_cols));
}

// A matrix [n_rows, n_cols] in kept_type and kept_layout: the file's bytes as they are,
// rearranged, or dequantized.
StatusOr<Matrix> load_matrix(const GgufFile& file, Backend& backend, const std::string& name,
                             int64_t n_cols, int64_t n_rows, Use use = Use::kMatmul) {
  HELIOS_ASSIGN_OR_RETURN(const GgufTensorInfo* t, find_checked(file, name, n_cols, n_rows));
  Matrix m;
  const bool embedding = use != Use::kMatmul;
  m.view = {nullptr, t->type, static_cast<int32_t>(n_rows), static_cast<int32_t>(n_cols),
            kept_layout(backend, t->type, n_cols, n_rows, use)};
  if (m.view.layout == WeightLayout::kInterleaved) {
    std::vector<uint8_t> packed(t->n_bytes);
    kernels::ref_interleave_weights(static_cast<uint32_t>(t->type), t->data, m.view.n_out, m.view.n_in, packed.data());
    HELIOS_ASSIGN_OR_RETURN(m.storage, upload(backend, name, packed.data(), packed.size()));
  } else if (kept_type(backend, t->type, embedding) == t->type) {
    HELIOS_ASSIGN_OR_RETURN(m.storage, upload(backend, name, t->data, t->n_bytes));
  } else {
    HELIOS_ASSIGN_OR_RETURN(m.storage, load_f32(file, backend, name, n_cols, n_rows));
    m.view.type = TensorType::kF32;
  }
  m.view.data = m.storage.data();
  return m;
}

}  // namespace

StatusOr<Matrix> upload_matrix(Backend& backend, const std::string& name, const float* data, int32_t n_out,
                               int32_t n_in) {
  Matrix m;
  const int64_t n = static_cast<int64_t>(n_out) * n_in;
  if (backend.supports_weight_type(TensorType::kQ8_0) && n_in % 32 == 0) {
    std::vector<uint8_t> q(static_cast<size_t>(tensor_row_bytes(TensorType::kQ8_0, n_in)) * n_out);
    HELIOS_RETURN_IF_ERROR(quantize_row(TensorType::kQ8_0, data, q.data(), n));
    HELIOS_ASSIGN_OR_RETURN(m.storage, upload(backend, name, q.data(), q.size()));
    m.view = {m.storage.data(), TensorType::kQ8_0, n_out, n_in};
    return m;
  }
  m.storage = Buffer(&backend, static_cast<size_t>(n));
  if (m.storage.empty()) return resource_exhausted("out of " + backend.name() + " memory for '" + name + "'");
  backend.upload(m.storage.data(), data, static_cast<size_t>(n));
  m.view = {m.storage.data(), TensorType::kF32, n_out, n_in};
  return m;
}

namespace {

// Loads tensors into one ModelWeights, counting their parameters and backend bytes, and reporting
// progress after each tensor.
struct WeightLoader {
  WeightLoader(const GgufFile& f, const ModelConfig& config, Backend& b, const LoadProgress& p)
      : file(f), c(config), backend(b), progress(p) {}

  const GgufFile& file;
  const ModelConfig& c;
  Backend& backend;
  const LoadProgress& progress;
  ModelWeights w;
  int n_done = 0;
  int n_total = 0;

  static std::string bias_name(int32_t l, const char* proj) {
    return "blk." + std::to_string(l) + ".attn_" + proj + ".bias";
  }
  // Tensors block l has in the file: nine, and its Q/K/V biases where it has them.
  int n_block_tensors(int32_t l) const {
    int n = 9;
    for (const char* proj : {"q", "k", "v"}) n += file.find_tensor(bias_name(l, proj)) != nullptr;
    return n;
  }
  void count(const Buffer& b, int64_t n_params) {
    w.n_params += n_params;
    w.n_bytes += static_cast<int64_t>(b.size() * sizeof(float));
    if (progress) progress(++n_done, n_total);
  }
  StatusOr<Buffer> vec(const std::string& name, int64_t n) {
    auto b = load_f32(file, backend, name, n, 0);
    if (b.ok()) count(*b, n);
    return b;
  }
  StatusOr<Matrix> mat(const std::string& name, int64_t cols, int64_t rows) {
    auto m = load_matrix(file, backend, name, cols, rows);
    if (m.ok()) count(m->storage, cols * rows);
    return m;
  }
  // Appends block l (0-based) to w.layers.
  Status block(int32_t l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    HELIOS_ASSIGN_OR_RETURN(lw.attn_norm, vec(p + "attn_norm.weight", c.n_embd));
    HELIOS_ASSIGN_OR_RETURN(lw.wq, mat(p + "attn_q.weight", c.n_embd, c.q_dim()));
    HELIOS_ASSIGN_OR_RETURN(lw.wk, mat(p + "attn_k.weight", c.n_embd, c.kv_dim()));
    HELIOS_ASSIGN_OR_RETURN(lw.wv, mat(p + "attn_v.weight", c.n_embd, c.kv_dim()));
    // Q/K/V biases where the file has them (qwen2 does; llama files may, as llama.cpp allows).
    for (auto [proj, bias, n] : {std::tuple{"q", &lw.bq, c.q_dim()}, std::tuple{"k", &lw.bk, c.kv_dim()},
                                 std::tuple{"v", &lw.bv, c.kv_dim()}}) {
      if (!file.find_tensor(bias_name(l, proj))) continue;
      HELIOS_ASSIGN_OR_RETURN(*bias, vec(bias_name(l, proj), n));
    }
    HELIOS_ASSIGN_OR_RETURN(lw.wo, mat(p + "attn_output.weight", c.q_dim(), c.n_embd));
    HELIOS_ASSIGN_OR_RETURN(lw.ffn_norm, vec(p + "ffn_norm.weight", c.n_embd));
    HELIOS_ASSIGN_OR_RETURN(lw.w_gate, mat(p + "ffn_gate.weight", c.n_embd, c.n_ff));
    HELIOS_ASSIGN_OR_RETURN(lw.w_up, mat(p + "ffn_up.weight", c.n_embd, c.n_ff));
    HELIOS_ASSIGN_OR_RETURN(lw.w_down, mat(p + "ffn_down.weight", c.n_ff, c.n_embd));
    w.layers.push_back(std::move(lw));
    return ok_status();
  }
};

}  // namespace

StatusOr<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& c, Backend& backend,
                                    int32_t n_layers, const LoadProgress& progress) {
  if (n_layers <= 0 || n_layers > c.n_layer) n_layers = c.n_layer;
  WeightLoader load(file, c, backend, progress);
  load.n_total = 3;
  for (int32_t l = 0; l < n_layers; ++l) load.n_total += load.n_block_tensors(l);
  ModelWeights& w = load.w;
  HELIOS_ASSIGN_OR_RETURN(w.tok_embd, load_matrix(file, backend, "token_embd.weight", c.n_embd, c.n_vocab,
                                                  c.tied_output ? Use::kTiedEmbedding : Use::kEmbedding));
  load.count(w.tok_embd.storage, int64_t{c.n_embd} * c.n_vocab);
  HELIOS_ASSIGN_OR_RETURN(w.output_norm, load.vec("output_norm.weight", c.n_embd));
  if (c.tied_output) {
    // One copy of the table when the LM head multiplies with the type and layout the embedding keeps.
    const TensorType file_type = file.find_tensor("token_embd.weight")->type;
    if (kept_type(backend, file_type, false) == w.tok_embd.view.type &&
        kept_layout(backend, file_type, c.n_embd, c.n_vocab, Use::kMatmul) == w.tok_embd.view.layout) {
      w.output.view = w.tok_embd.view;
    } else {
      HELIOS_ASSIGN_OR_RETURN(w.output, load_matrix(file, backend, "token_embd.weight", c.n_embd, c.n_vocab));
      w.n_bytes += static_cast<int64_t>(w.output.storage.size() * sizeof(float));
    }
    if (progress) progress(++load.n_done, load.n_total);
  } else {
    HELIOS_ASSIGN_OR_RETURN(w.output, load.mat("output.weight", c.n_embd, c.n_vocab));
  }
  for (int32_t l = 0; l < n_layers; ++l) HELIOS_RETURN_IF_ERROR(load.block(l));
  return std::move(w);
}

StatusOr<ModelWeights> load_layer_range(const GgufFile& file, const ModelConfig& c, Backend& backend,
                                        int32_t first_layer, int32_t end_layer, const LoadProgress& progress) {
  if (first_layer < 0 || first_layer >= end_layer || end_layer > c.n_layer) {
    return invalid_argument(file.path() + ": cannot load blocks [" + std::to_string(first_layer) + ", " +
                            std::to_string(end_layer) + ") of a model with " + std::to_string(c.n_layer) +
                            "; the range must be non-empty and within it");
  }
  WeightLoader load(file, c, backend, progress);
  for (int32_t l = first_layer; l < end_layer; ++l) load.n_total += load.n_block_tensors(l);
  for (int32_t l = first_layer; l < end_layer; ++l) HELIOS_RETURN_IF_ERROR(load.block(l));
  return std::move(load.w);
}

}  // namespace helios
