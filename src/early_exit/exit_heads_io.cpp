// The exit-heads sidecar: a GGUF file of F32 adapters and probes, one set per exit layer,
// checked against the model it is loaded for.
//
// Metadata: general.architecture = "helios-exits", helios.exits.{model_name, n_layer, n_embd,
// layers} and helios.exits.<layer>.{agreement, probe_accuracy, n_tokens, threshold (optional),
// kind (optional)}.
// Tensors (GGML dims order, row length first): exit.<layer>.adapter.weight [n_embd in, n_embd out],
// exit.<layer>.adapter.bias [n_embd], exit.<layer>.probe.weight [n_embd], exit.<layer>.probe.bias [1],
// exit.<layer>.curve.prob [k] and exit.<layer>.curve.agreement [k] (optional: the agreement curve),
// exit.<layer>.mlp.{gate,up} [n_embd in, hidden out] and exit.<layer>.mlp.down [hidden in, n_embd out]
// (optional: the residual MLP of an "mlp" head).
// An absent adapter is the identity; an absent probe means the exit has none. The optional parts
// came later: files without them still load, as heads without a threshold, kind, curve or MLP.
// A lookahead head (helios.exits.lookahead = true) is stored as a head at layer n_layer, keys and
// tensors named as an exit's, with exit.<n_layer>.token.weight [n_embd in, n_embd out] (optional);
// files without the key have none.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "helios/early_exit.h"
#include "helios/gguf.h"

namespace helios {
namespace {

constexpr const char* kArchitecture = "helios-exits";

std::string head_key(int32_t layer, const char* field) {
  return "helios.exits." + std::to_string(layer) + "." + field;
}
std::string tensor_name(int32_t layer, const char* part) {
  return "exit." + std::to_string(layer) + "." + part;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// What save and load both require of a head: sizes that match n_embd, a layer in range.
Status check_head(const ExitHeadParams& head, int32_t n_layer, int32_t n_embd, const std::string& where,
                  bool lookahead = false) {
  const std::string layer = (lookahead ? "lookahead head at layer " : "exit layer ") + std::to_string(head.layer);
  if (lookahead && head.layer != n_layer) {
    return invalid_argument(where + layer + ": a lookahead head reads the last layer (" + std::to_string(n_layer) + ")");
  }
  if (!lookahead && (head.layer < 1 || head.layer > n_layer - 1)) {
    return invalid_argument(where + layer + " is out of range [1, " + std::to_string(n_layer - 1) + "]");
  }
  const size_t d = static_cast<size_t>(n_embd);
  const bool identity = head.adapter_weight.empty() && head.adapter_bias.empty();
  if (!identity && (head.adapter_weight.size() != d * d || head.adapter_bias.size() != d)) {
    return invalid_argument(where + layer + ": adapter has " + std::to_string(head.adapter_weight.size()) +
                            " weights and " + std::to_string(head.adapter_bias.size()) + " biases, expected " +
                            std::to_string(d * d) + " and " + std::to_string(d));
  }
  if (head.curve_prob.size() != head.curve_agreement.size() ||
      !std::is_sorted(head.curve_prob.begin(), head.curve_prob.end())) {
    return invalid_argument(where + layer + ": the agreement curve needs as many shares as probabilities (" +
                            std::to_string(head.curve_prob.size()) + " and " +
                            std::to_string(head.curve_agreement.size()) + "), the probabilities ascending");
  }
  const ResidualMlp& mlp = head.mlp;
  const size_t h = static_cast<size_t>(std::max(mlp.hidden, 0));
  if (mlp.hidden < 0 || mlp.gate.size() != h * d || mlp.up.size() != h * d || mlp.down.size() != h * d) {
    return invalid_argument(where + layer + ": MLP of hidden width " + std::to_string(mlp.hidden) + " has " +
                            std::to_string(mlp.gate.size()) + " gate, " + std::to_string(mlp.up.size()) + " up and " +
                            std::to_string(mlp.down.size()) + " down weights, expected " + std::to_string(h * d) +
                            " each");
  }
  if (!head.token_weight.empty() && (!lookahead || head.token_weight.size() != d * d)) {
    return invalid_argument(where + layer + ": a token map belongs to a lookahead head and is [n_embd, n_embd] (" +
                            std::to_string(d * d) + " weights), got " + std::to_string(head.token_weight.size()));
  }
  if (!head.probe_weight.empty() && head.probe_weight.size() != d) {
    return invalid_argument(where + layer + ": probe has " + std::to_string(head.probe_weight.size()) +
                            " weights, expected " + std::to_string(d));
  }
  return ok_status();
}

// Copies an F32 tensor of exactly `dims` out of the mapping; NOT_FOUND when it is absent.
StatusOr<std::vector<float>> read_f32(const GgufFile& file, const std::string& name,
                                      const std::vector<int64_t>& dims) {
  const GgufTensorInfo* t = file.find_tensor(name);
  if (!t) return not_found(file.path() + ": tensor '" + name + "' is missing");
  if (t->type != TensorType::kF32 || t->dims != dims) {
    return invalid_argument(file.path() + ": tensor '" + name + "' is " + tensor_type_name(t->type) + " " +
                            dims_string(t->dims) + ", expected F32 " + dims_string(dims));
  }
  std::vector<float> values(static_cast<size_t>(t->n_elements()));
  std::memcpy(values.data(), t->data, values.size() * sizeof(float));
  for (float v : values) {
    if (!std::isfinite(v)) return invalid_argument(file.path() + ": tensor '" + name + "' holds a non-finite value");
  }
  return values;
}

// Reads a pair of tensors that must be both present or both absent; false when both are absent.
StatusOr<bool> read_pair(const GgufFile& file, const std::string& first, const std::vector<int64_t>& first_dims,
                         std::vector<float>* first_out, const std::string& second,
                         const std::vector<int64_t>& second_dims, std::vector<float>* second_out) {
  const bool has_first = file.find_tensor(first) != nullptr;
  const bool has_second = file.find_tensor(second) != nullptr;
  if (!has_first && !has_second) return false;
  if (has_first != has_second) {
    return invalid_argument(file.path() + ": tensor '" + (has_first ? first : second) + "' is present but '" +
                            (has_first ? second : first) + "' is missing");
  }
  HELIOS_ASSIGN_OR_RETURN(*first_out, read_f32(file, first, first_dims));
  HELIOS_ASSIGN_OR_RETURN(*second_out, read_f32(file, second, second_dims));
  return true;
}

StatusOr<ExitHeadParams> load_head(const GgufFile& file, int32_t layer, int32_t n_embd) {
  ExitHeadParams head;
  head.layer = layer;
  const int64_t d = n_embd;
  // An absent adapter leaves both vectors empty: the identity.
  HELIOS_RETURN_IF_ERROR(read_pair(file, tensor_name(layer, "adapter.weight"), {d, d}, &head.adapter_weight,
                                   tensor_name(layer, "adapter.bias"), {d}, &head.adapter_bias)
                             .status());
  if (file.find_tensor(tensor_name(layer, "token.weight"))) {
    HELIOS_ASSIGN_OR_RETURN(head.token_weight, read_f32(file, tensor_name(layer, "token.weight"), {d, d}));
  }
  std::vector<float> probe_bias;
  HELIOS_ASSIGN_OR_RETURN(bool has_probe,
                          read_pair(file, tensor_name(layer, "probe.weight"), {d}, &head.probe_weight,
                                    tensor_name(layer, "probe.bias"), {1}, &probe_bias));
  if (has_probe) head.probe_bias = probe_bias[0];
  if (const GgufTensorInfo* curve = file.find_tensor(tensor_name(layer, "curve.prob")); curve && !curve->dims.empty()) {
    const std::vector<int64_t> dims = {curve->dims[0]};
    HELIOS_RETURN_IF_ERROR(read_pair(file, tensor_name(layer, "curve.prob"), dims, &head.curve_prob,
                                     tensor_name(layer, "curve.agreement"), dims, &head.curve_agreement)
                               .status());
  } else if (file.find_tensor(tensor_name(layer, "curve.agreement"))) {
    return invalid_argument(file.path() + ": tensor '" + tensor_name(layer, "curve.agreement") + "' is present but '" +
                            tensor_name(layer, "curve.prob") + "' is missing");
  }
  if (const GgufTensorInfo* gate = file.find_tensor(tensor_name(layer, "mlp.gate")); gate && gate->dims.size() == 2) {
    const int64_t h = gate->dims[1];
    if (h < 1 || h > (int64_t{1} << 20)) {
      return invalid_argument(file.path() + ": tensor '" + tensor_name(layer, "mlp.gate") + "' has hidden width " +
                              std::to_string(h));
    }
    head.mlp.hidden = static_cast<int32_t>(h);
    HELIOS_ASSIGN_OR_RETURN(head.mlp.gate, read_f32(file, tensor_name(layer, "mlp.gate"), {d, h}));
    HELIOS_ASSIGN_OR_RETURN(head.mlp.up, read_f32(file, tensor_name(layer, "mlp.up"), {d, h}));
    HELIOS_ASSIGN_OR_RETURN(head.mlp.down, read_f32(file, tensor_name(layer, "mlp.down"), {h, d}));
  } else if (file.find_tensor(tensor_name(layer, "mlp.gate")) || file.find_tensor(tensor_name(layer, "mlp.up")) ||
             file.find_tensor(tensor_name(layer, "mlp.down"))) {
    return invalid_argument(file.path() + ": exit " + std::to_string(layer) +
                            ": the MLP needs mlp.gate [n_embd, hidden], mlp.up and mlp.down, all three");
  }
  if (file.find(head_key(layer, "kind"))) {
    HELIOS_ASSIGN_OR_RETURN(head.kind, file.get_string(head_key(layer, "kind")));
  } else {
    head.kind = head.adapter_weight.empty() ? "identity" : "ridge";  // what files without it held
  }

  HELIOS_ASSIGN_OR_RETURN(double agreement, file.get_float(head_key(layer, "agreement")));
  HELIOS_ASSIGN_OR_RETURN(double probe_accuracy, file.get_float(head_key(layer, "probe_accuracy")));
  HELIOS_ASSIGN_OR_RETURN(uint64_t n_tokens, file.get_uint(head_key(layer, "n_tokens")));
  head.agreement = static_cast<float>(agreement);
  head.probe_accuracy = static_cast<float>(probe_accuracy);
  head.n_tokens = static_cast<int64_t>(n_tokens);
  if (file.find(head_key(layer, "threshold"))) {  // optional: older sidecars have none
    HELIOS_ASSIGN_OR_RETURN(double threshold, file.get_float(head_key(layer, "threshold")));
    if (!(threshold >= 0.0 && threshold <= 1.0)) {
      return invalid_argument(head_key(layer, "threshold") + " must be in [0, 1], got " + std::to_string(threshold));
    }
    head.threshold = static_cast<float>(threshold);
  }
  return head;
}

}  // namespace

const ExitHeadParams* ExitHeadSet::find(int32_t layer) const {
  for (const ExitHeadParams& head : heads) {
    if (head.layer == layer) return &head;
  }
  return nullptr;
}

Status save_exit_heads(const ExitHeadSet& set, const std::string& path) {
  const std::string where = "cannot save exit heads to '" + path + "': ";
  if (set.n_layer < 2 || set.n_embd < 1) {
    return invalid_argument(where + "needs n_layer >= 2 and n_embd >= 1 (got " + std::to_string(set.n_layer) +
                            " and " + std::to_string(set.n_embd) + ")");
  }
  GgufWriter w;
  w.set_string("general.architecture", kArchitecture);
  w.set_string("helios.exits.model_name", set.model_name);
  w.set_uint32("helios.exits.n_layer", static_cast<uint32_t>(set.n_layer));
  w.set_uint32("helios.exits.n_embd", static_cast<uint32_t>(set.n_embd));
  std::vector<int32_t> layers;
  const int64_t d = set.n_embd;
  for (const ExitHeadParams& head : set.heads) {
    HELIOS_RETURN_IF_ERROR(check_head(head, set.n_layer, set.n_embd, where));
    if (!layers.empty() && head.layer <= layers.back()) {
      return invalid_argument(where + "heads must be in ascending layer order without repeats (layer " +
                              std::to_string(head.layer) + " after " + std::to_string(layers.back()) + ")");
    }
    layers.push_back(head.layer);
  }
  if (set.has_lookahead) {
    HELIOS_RETURN_IF_ERROR(check_head(set.lookahead, set.n_layer, set.n_embd, where, /*lookahead=*/true));
    w.set_bool("helios.exits.lookahead", true);
  }
  std::vector<const ExitHeadParams*> to_write;
  for (const ExitHeadParams& head : set.heads) to_write.push_back(&head);
  if (set.has_lookahead) to_write.push_back(&set.lookahead);
  for (const ExitHeadParams* written : to_write) {
    const ExitHeadParams& head = *written;
    w.set_float32(head_key(head.layer, "agreement"), head.agreement);
    w.set_float32(head_key(head.layer, "probe_accuracy"), head.probe_accuracy);
    w.set_float32(head_key(head.layer, "threshold"), head.threshold);
    w.set_uint64(head_key(head.layer, "n_tokens"), static_cast<uint64_t>(std::max<int64_t>(0, head.n_tokens)));
    w.set_string(head_key(head.layer, "kind"), head.kind);
    if (!head.adapter_weight.empty()) {
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "adapter.weight"), TensorType::kF32, {d, d},
                                          f32_bytes(head.adapter_weight)));
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "adapter.bias"), TensorType::kF32, {d},
                                          f32_bytes(head.adapter_bias)));
    }
    if (!head.token_weight.empty()) {
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "token.weight"), TensorType::kF32, {d, d},
                                          f32_bytes(head.token_weight)));
    }
    if (!head.probe_weight.empty()) {
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "probe.weight"), TensorType::kF32, {d},
                                          f32_bytes(head.probe_weight)));
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "probe.bias"), TensorType::kF32, {1},
                                          f32_bytes({head.probe_bias})));
    }
    if (!head.mlp.empty()) {
      const int64_t h = head.mlp.hidden;
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "mlp.gate"), TensorType::kF32, {d, h},
                                          f32_bytes(head.mlp.gate)));
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "mlp.up"), TensorType::kF32, {d, h},
                                          f32_bytes(head.mlp.up)));
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "mlp.down"), TensorType::kF32, {h, d},
                                          f32_bytes(head.mlp.down)));
    }
    if (!head.curve_prob.empty()) {
      const int64_t k = static_cast<int64_t>(head.curve_prob.size());
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "curve.prob"), TensorType::kF32, {k},
                                          f32_bytes(head.curve_prob)));
      HELIOS_RETURN_IF_ERROR(w.add_tensor(tensor_name(head.layer, "curve.agreement"), TensorType::kF32, {k},
                                          f32_bytes(head.curve_agreement)));
    }
  }
  w.set_int32_array("helios.exits.layers", layers);
  return w.write(path);
}

StatusOr<ExitHeadSet> load_exit_heads(const std::string& path, const ModelConfig& config) {
  HELIOS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  auto architecture = file->get_string("general.architecture");
  if (!architecture.ok() || *architecture != kArchitecture) {
    const std::string found = architecture.ok() ? "'" + *architecture + "'" : "missing";
    return invalid_argument(path + ": not an exit-heads sidecar (general.architecture is " + found +
                            ", expected '" + kArchitecture + "'; `helios calibrate` writes one)");
  }

  ExitHeadSet set;
  HELIOS_ASSIGN_OR_RETURN(set.model_name, file->get_string("helios.exits.model_name"));
  HELIOS_ASSIGN_OR_RETURN(uint64_t n_layer, file->get_uint("helios.exits.n_layer"));
  HELIOS_ASSIGN_OR_RETURN(uint64_t n_embd, file->get_uint("helios.exits.n_embd"));
  if (n_layer != static_cast<uint64_t>(config.n_layer) || n_embd != static_cast<uint64_t>(config.n_embd)) {
    return invalid_argument(path + ": fitted for a model with " + std::to_string(n_layer) + " layers and n_embd " +
                            std::to_string(n_embd) + ", but this model has " + std::to_string(config.n_layer) +
                            " layers and n_embd " + std::to_string(config.n_embd));
  }
  set.n_layer = config.n_layer;
  set.n_embd = config.n_embd;

  const std::vector<int64_t>* layers = file->get_int_array("helios.exits.layers");
  if (!layers) return invalid_argument(path + ": 'helios.exits.layers' is missing or not an integer array");
  std::set<std::string> known_tensors;
  auto claim_tensors = [&](int32_t layer) {
    for (const char* part : {"adapter.weight", "adapter.bias", "probe.weight", "probe.bias", "curve.prob",
                             "curve.agreement", "mlp.gate", "mlp.up", "mlp.down"}) {
      known_tensors.insert(tensor_name(layer, part));
    }
  };
  for (int64_t layer : *layers) {
    if (layer < 1 || layer > set.n_layer - 1) {
      return invalid_argument(path + ": exit layer " + std::to_string(layer) + " is out of range [1, " +
                              std::to_string(set.n_layer - 1) + "] for a model with " +
                              std::to_string(set.n_layer) + " layers");
    }
    if (!set.heads.empty() && layer <= set.heads.back().layer) {
      return invalid_argument(path + ": 'helios.exits.layers' must be ascending without repeats (layer " +
                              std::to_string(layer) + " after " + std::to_string(set.heads.back().layer) + ")");
    }
    const auto exit_layer = static_cast<int32_t>(layer);
    HELIOS_ASSIGN_OR_RETURN(ExitHeadParams head, load_head(*file, exit_layer, set.n_embd));
    set.heads.push_back(std::move(head));
    claim_tensors(exit_layer);
  }
  if (file->find("helios.exits.lookahead")) {
    HELIOS_ASSIGN_OR_RETURN(set.has_lookahead, file->get_bool("helios.exits.lookahead"));
  }
  if (set.has_lookahead) {
    HELIOS_ASSIGN_OR_RETURN(set.lookahead, load_head(*file, set.n_layer, set.n_embd));
    claim_tensors(set.n_layer);
    known_tensors.insert(tensor_name(set.n_layer, "token.weight"));
  }
  // A tensor no listed layer claims means the file and its layer list disagree.
  for (const GgufTensorInfo& t : file->tensors()) {
    if (!known_tensors.count(t.name)) {
      return invalid_argument(path + ": tensor '" + t.name + "' belongs to no layer in 'helios.exits.layers'");
    }
  }
  return set;
}

}  // namespace helios
