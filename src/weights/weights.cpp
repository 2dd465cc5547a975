// GGUF tensors → backend buffers, with their shapes checked against the model config.
#include <string>

#include "helios/gguf.h"
#include "helios/weights.h"

namespace helios {
namespace {

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Dequantizes tensor `name` (GGUF dims {n_cols, n_rows}, or {n_cols} when n_rows is 0) into
// backend memory as n_rows rows of n_cols floats.
StatusOr<Buffer> load_tensor(const GgufFile& file, Backend& backend, const std::string& name,
                             int64_t n_cols, int64_t n_rows) {
  const GgufTensorInfo* t = file.find_tensor(name);
  if (!t) return invalid_argument(file.path() + ": tensor '" + name + "' is missing");
  const std::vector<int64_t> want = n_rows ? std::vector<int64_t>{n_cols, n_rows}
                                           : std::vector<int64_t>{n_cols};
  if (t->dims != want) {
    return invalid_argument(file.path() + ": tensor '" + name + "' has shape " +
                            shape_string(t->dims) + ", expected " + shape_string(want));
  }
  const int64_t rows = n_rows ? n_rows : 1;
  std::vector<float> host(static_cast<size_t>(rows * n_cols));
  const int64_t row_bytes = tensor_row_bytes(t->type, n_cols);
  for (int64_t r = 0; r < rows; ++r) {
    Status s = dequantize_row(t->type, t->data + r * row_bytes, host.data() + r * n_cols, n_cols);
    if (!s.ok()) return invalid_argument(file.path() + ": tensor '" + name + "': " + s.message());
  }
  Buffer buf(&backend, host.size());
  if (buf.empty()) {
    return resource_exhausted("out of " + backend.name() + " memory loading '" + name + "' (" +
                              std::to_string(host.size() * 4) + " bytes)");
  }
  backend.upload(buf.data(), host.data(), host.size());
  return buf;
}

}  // namespace

StatusOr<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& c, Backend& backend,
                                    int32_t n_layers, const LoadProgress& progress) {
  if (n_layers <= 0 || n_layers > c.n_layer) n_layers = c.n_layer;
  ModelWeights w;
  const int n_total = 3 + 9 * n_layers;
  int n_done = 0;
  auto load = [&](const std::string& name, int64_t cols, int64_t rows) -> StatusOr<Buffer> {
    auto b = load_tensor(file, backend, name, cols, rows);
    if (b.ok()) {
      w.n_params += cols * (rows ? rows : 1);
      if (progress) progress(++n_done, n_total);
    }
    return b;
  };
  HELIOS_ASSIGN_OR_RETURN(w.tok_embd, load("token_embd.weight", c.n_embd, c.n_vocab));
  HELIOS_ASSIGN_OR_RETURN(w.output_norm, load("output_norm.weight", c.n_embd, 0));
  if (!c.tied_output) {
    HELIOS_ASSIGN_OR_RETURN(w.output, load("output.weight", c.n_embd, c.n_vocab));
  } else if (progress) {
    progress(++n_done, n_total);
  }
  for (int32_t l = 0; l < n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    HELIOS_ASSIGN_OR_RETURN(lw.attn_norm, load(p + "attn_norm.weight", c.n_embd, 0));
    HELIOS_ASSIGN_OR_RETURN(lw.wq, load(p + "attn_q.weight", c.n_embd, c.q_dim()));
    HELIOS_ASSIGN_OR_RETURN(lw.wk, load(p + "attn_k.weight", c.n_embd, c.kv_dim()));
    HELIOS_ASSIGN_OR_RETURN(lw.wv, load(p + "attn_v.weight", c.n_embd, c.kv_dim()));
    HELIOS_ASSIGN_OR_RETURN(lw.wo, load(p + "attn_output.weight", c.q_dim(), c.n_embd));
    HELIOS_ASSIGN_OR_RETURN(lw.ffn_norm, load(p + "ffn_norm.weight", c.n_embd, 0));
    HELIOS_ASSIGN_OR_RETURN(lw.w_gate, load(p + "ffn_gate.weight", c.n_embd, c.n_ff));
    HELIOS_ASSIGN_OR_RETURN(lw.w_up, load(p + "ffn_up.weight", c.n_embd, c.n_ff));
    HELIOS_ASSIGN_OR_RETURN(lw.w_down, load(p + "ffn_down.weight", c.n_ff, c.n_embd));
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace helios
