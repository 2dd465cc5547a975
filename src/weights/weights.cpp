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

// Which part of a [n_rows, n_cols] tensor a rank holds: rows [row0, row1), columns [col0, col1)
// (col1 = 0 and row1 = 0: all). Column bounds fall on the type's blocks.
struct Slice {
  int64_t row0 = 0, row1 = 0, col0 = 0, col1 = 0;
  static Slice rows(int64_t r0, int64_t r1) { return {r0, r1, 0, 0}; }
  static Slice cols(int64_t c0, int64_t c1) { return {0, 0, c0, c1}; }
};

// A tensor's bytes as it is kept: all of it (pointing into the file) or a slice (copied).
struct TensorBytes {
  const uint8_t* data = nullptr;
  int64_t n_bytes = 0, n_rows = 0, n_cols = 0;
  std::vector<uint8_t> copy;  // the slice's bytes, when one was taken
};

StatusOr<TensorBytes> slice_bytes(const GgufFile& file, const GgufTensorInfo& t, const std::string& name,
                                  int64_t n_cols, int64_t n_rows, Slice s) {
  if (s.row1 == 0) s.row1 = n_rows ? n_rows : 1;
  if (s.col1 == 0) s.col1 = n_cols;
  const int64_t rows = n_rows ? n_rows : 1;
  TensorBytes b{t.data, static_cast<int64_t>(t.n_bytes), s.row1 - s.row0, s.col1 - s.col0, {}};
  if (s.row0 == 0 && s.row1 == rows && s.col0 == 0 && s.col1 == n_cols) return b;
  const int64_t block = tensor_type_traits(static_cast<uint32_t>(t.type))->block_elems;
  if (s.row0 < 0 || s.row1 > rows || s.row0 >= s.row1 || s.col0 < 0 || s.col1 > n_cols || s.col0 >= s.col1 ||
      s.col0 % block != 0 || s.col1 % block != 0) {
    return invalid_argument(file.path() + ": tensor '" + name + "' (" + tensor_type_name(t.type) + ", " +
                            std::to_string(block) + "-value blocks) cannot be split at rows [" +
                            std::to_string(s.row0) + ", " + std::to_string(s.row1) + "), columns [" +
                            std::to_string(s.col0) + ", " + std::to_string(s.col1) + ")");
  }
  const int64_t row_bytes = tensor_row_bytes(t.type, n_cols), skip = tensor_row_bytes(t.type, s.col0);
  const int64_t kept = tensor_row_bytes(t.type, s.col1 - s.col0);
  b.copy.resize(static_cast<size_t>(kept * b.n_rows));
  for (int64_t r = 0; r < b.n_rows; ++r) {
    std::memcpy(b.copy.data() + r * kept, t.data + (s.row0 + r) * row_bytes + skip, static_cast<size_t>(kept));
  }
  b.data = b.copy.data();
  b.n_bytes = static_cast<int64_t>(b.copy.size());
  return b;
}

// Dequantizes tensor `name` (GGUF dims {n_cols, n_rows}, or {n_cols} when n_rows is 0), or the
// slice of it, into backend memory as rows of floats.
StatusOr<Buffer> load_f32(const GgufFile& file, Backend& backend, const std::string& name,
                          int64_t n_cols, int64_t n_rows, Slice slice = {}) {
  HELIOS_ASSIGN_OR_RETURN(const GgufTensorInfo* t, find_checked(file, name, n_cols, n_rows));
  HELIOS_ASSIGN_OR_RETURN(TensorBytes b, slice_bytes(file, *t, name, n_cols, n_rows, slice));
  std::vector<float> host(static_cast<size_t>(b.n_rows * b.n_cols));
  const int64_t row_bytes = tensor_row_bytes(t->type, b.n_cols);
  for (int64_t r = 0; r < b.n_rows; ++r) {
    Status s = dequantize_row(t->type, b.data + r * row_bytes, host.data() + r * b.n_cols, b.n_cols);
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

// A matrix [n_rows, n_cols], or the slice of it a rank holds, in kept_type and kept_layout: the
// file's bytes as they are, rearranged, or dequantized.
StatusOr<Matrix> load_matrix(const GgufFile& file, Backend& backend, const std::string& name,
                             int64_t n_cols, int64_t n_rows, Use use = Use::kMatmul, Slice slice = {}) {
  HELIOS_ASSIGN_OR_RETURN(const GgufTensorInfo* t, find_checked(file, name, n_cols, n_rows));
  HELIOS_ASSIGN_OR_RETURN(TensorBytes b, slice_bytes(file, *t, name, n_cols, n_rows, slice));
  Matrix m;
  const bool embedding = use != Use::kMatmul;
  m.view = {nullptr, t->type, static_cast<int32_t>(b.n_rows), static_cast<int32_t>(b.n_cols),
            kept_layout(backend, t->type, b.n_cols, b.n_rows, use)};
  if (m.view.layout == WeightLayout::kInterleaved) {
    std::vector<uint8_t> packed(static_cast<size_t>(b.n_bytes));
    kernels::ref_interleave_weights(static_cast<uint32_t>(t->type), b.data, m.view.n_out, m.view.n_in, packed.data());
    HELIOS_ASSIGN_OR_RETURN(m.storage, upload(backend, name, packed.data(), packed.size()));
  } else if (kept_type(backend, t->type, embedding) == t->type) {
    HELIOS_ASSIGN_OR_RETURN(m.storage, upload(backend, name, b.data, static_cast<size_t>(b.n_bytes)));
  } else {
    HELIOS_ASSIGN_OR_RETURN(m.storage, load_f32(file, backend, name, n_cols, n_rows, slice));
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
  WeightLoader(const GgufFile& f, const ModelConfig& config, Backend& b, const LoadProgress& p, const ShardSpec& sh)
      : file(f), c(config), backend(b), progress(p), shard(sh) {}

  const GgufFile& file;
  const ModelConfig& c;  // the whole model's shapes (the file's)
  Backend& backend;
  const LoadProgress& progress;
  const ShardSpec& shard;  // the slice this rank keeps (all of it when not sharded)
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
  StatusOr<Buffer> vec(const std::string& name, int64_t n, Slice slice = {}) {
    auto b = load_f32(file, backend, name, n, 0, slice);
    if (b.ok()) count(*b, n);
    return b;
  }
  StatusOr<Matrix> mat(const std::string& name, int64_t cols, int64_t rows, Slice slice = {}) {
    auto m = load_matrix(file, backend, name, cols, rows, Use::kMatmul, slice);
    if (m.ok()) count(m->storage, int64_t{m->view.n_in} * m->view.n_out);
    return m;
  }
  // This rank's query rows, KV rows and FFN units (everything when not sharded).
  Slice q_rows() const { return part(shard.head0 * c.head_dim, shard.head1 * c.head_dim, c.q_dim()); }
  Slice kv_rows() const { return part(shard.kv_head0 * c.head_dim, shard.kv_head1 * c.head_dim, c.kv_dim()); }
  Slice ff_rows() const { return part(shard.ff0, shard.ff1, c.n_ff); }
  Slice part(int64_t a, int64_t b, int64_t n) const { return shard.sharded() ? Slice::rows(a, b) : Slice::rows(0, n); }
  static Slice as_cols(Slice rows) { return Slice::cols(rows.row0, rows.row1); }
  // Appends block l (0-based) to w.layers.
  Status block(int32_t l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    HELIOS_ASSIGN_OR_RETURN(lw.attn_norm, vec(p + "attn_norm.weight", c.n_embd));
    // Column-parallel Q/K/V, gate and up (this rank's rows); row-parallel O and down (its columns).
    HELIOS_ASSIGN_OR_RETURN(lw.wq, mat(p + "attn_q.weight", c.n_embd, c.q_dim(), q_rows()));
    HELIOS_ASSIGN_OR_RETURN(lw.wk, mat(p + "attn_k.weight", c.n_embd, c.kv_dim(), kv_rows()));
    HELIOS_ASSIGN_OR_RETURN(lw.wv, mat(p + "attn_v.weight", c.n_embd, c.kv_dim(), kv_rows()));
    // Q/K/V biases where the file has them (qwen2 does; llama files may, as llama.cpp allows).
    for (auto [proj, bias, n, rows] : {std::tuple{"q", &lw.bq, c.q_dim(), q_rows()},
                                       std::tuple{"k", &lw.bk, c.kv_dim(), kv_rows()},
                                       std::tuple{"v", &lw.bv, c.kv_dim(), kv_rows()}}) {
      if (!file.find_tensor(bias_name(l, proj))) continue;
      HELIOS_ASSIGN_OR_RETURN(*bias, vec(bias_name(l, proj), n, as_cols(rows)));
    }
    HELIOS_ASSIGN_OR_RETURN(lw.wo, mat(p + "attn_output.weight", c.q_dim(), c.n_embd, as_cols(q_rows())));
    HELIOS_ASSIGN_OR_RETURN(lw.ffn_norm, vec(p + "ffn_norm.weight", c.n_embd));
    HELIOS_ASSIGN_OR_RETURN(lw.w_gate, mat(p + "ffn_gate.weight", c.n_embd, c.n_ff, ff_rows()));
    HELIOS_ASSIGN_OR_RETURN(lw.w_up, mat(p + "ffn_up.weight", c.n_embd, c.n_ff, ff_rows()));
    HELIOS_ASSIGN_OR_RETURN(lw.w_down, mat(p + "ffn_down.weight", c.n_ff, c.n_embd, as_cols(ff_rows())));
    w.layers.push_back(std::move(lw));
    return ok_status();
  }
};

}  // namespace

StatusOr<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& c, Backend& backend,
                                    int32_t n_layers, const LoadProgress& progress, const ShardSpec& shard) {
  if (n_layers <= 0 || n_layers > c.n_layer) n_layers = c.n_layer;
  WeightLoader load(file, c, backend, progress, shard);
  load.n_total = 3;
  for (int32_t l = 0; l < n_layers; ++l) load.n_total += load.n_block_tensors(l);
  ModelWeights& w = load.w;
  HELIOS_ASSIGN_OR_RETURN(w.tok_embd, load_matrix(file, backend, "token_embd.weight", c.n_embd, c.n_vocab,
                                                  c.tied_output ? Use::kTiedEmbedding : Use::kEmbedding));
  load.count(w.tok_embd.storage, int64_t{c.n_embd} * c.n_vocab);
  HELIOS_ASSIGN_OR_RETURN(w.output_norm, load.vec("output_norm.weight", c.n_embd));
  if (file.find_tensor("rope_freqs.weight")) {
    ++load.n_total;
    HELIOS_ASSIGN_OR_RETURN(w.rope_freqs, load.vec("rope_freqs.weight", c.n_rot / 2));
  }
  if (shard.sharded()) {
    // Vocabulary-parallel: this rank's rows of the LM head, a copy of them even when tied.
    const std::string name = c.tied_output ? "token_embd.weight" : "output.weight";
    HELIOS_ASSIGN_OR_RETURN(w.output, load.mat(name, c.n_embd, c.n_vocab, Slice::rows(shard.vocab0, shard.vocab1)));
  } else if (c.tied_output) {
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
                                        int32_t first_layer, int32_t end_layer, const LoadProgress& progress,
                                        const ShardSpec& shard) {
  if (first_layer < 0 || first_layer >= end_layer || end_layer > c.n_layer) {
    return invalid_argument(file.path() + ": cannot load blocks [" + std::to_string(first_layer) + ", " +
                            std::to_string(end_layer) + ") of a model with " + std::to_string(c.n_layer) +
                            "; the range must be non-empty and within it");
  }
  WeightLoader load(file, c, backend, progress, shard);
  for (int32_t l = first_layer; l < end_layer; ++l) load.n_total += load.n_block_tensors(l);
  for (int32_t l = first_layer; l < end_layer; ++l) HELIOS_RETURN_IF_ERROR(load.block(l));
  return std::move(load.w);
}

}  // namespace helios
