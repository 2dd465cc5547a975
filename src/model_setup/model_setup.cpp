// A model with its exits: load, exit points, heads, default rule (include/helios/model_setup.h).
#include "helios/model_setup.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace helios {
namespace {

// "<name>: <message>", or the status as it is when the setting has no name.
Status named(const std::string& name, const Status& s) {
  if (s.ok() || name.empty()) return s;
  return invalid_argument(name + ": " + s.message());
}

Status field_error(std::string_view prefix, std::string_view key, const std::string& what) {
  return invalid_argument(std::string(prefix) + std::string(key) + ": " + what);
}

std::string join_layers(const std::vector<int32_t>& layers) {
  std::string out;
  for (int32_t l : layers) out += (out.empty() ? "" : ", ") + std::to_string(l);
  return out;
}

// No exit points asked for: the heads file's layers, else every 4th layer.
ExitPointsSpec with_default_exits(ExitPointsSpec spec, const ExitHeadSet* heads) {
  if (!spec.layers.empty() || spec.every != 0) return spec;
  if (heads && !heads->heads.empty()) {
    for (const auto& h : heads->heads) spec.layers.push_back(h.layer);
  } else {
    spec.every = 4;
    spec.min_layer = 4;
  }
  return spec;
}

}  // namespace

std::string rank_backend_name(const std::string& backend, int32_t rank) {
  if (backend.rfind("cuda", 0) != 0) return backend;
  const size_t colon = backend.find(':');
  const int first = colon == std::string::npos ? 0 : std::atoi(backend.c_str() + colon + 1);
  return "cuda:" + std::to_string(first + rank);
}

int rank_threads(int threads, int32_t ranks) {
  const int all = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, all / std::max(1, ranks));
}

StatusOr<ModelSetup> setup_model(Backend& backend, const ModelSetupOptions& o) {
  const ModelSetupOptions::Names& names = o.names;
  ModelLoadOptions load;
  load.n_layers = o.load_layers;
  load.rope_scaling = o.rope_scaling;
  load.progress = o.progress;
  load.tensor_parallel = o.tensor_parallel;
  load.make_rank_backend = o.make_rank_backend;
  ModelSetup out;
  HELIOS_ASSIGN_OR_RETURN(out.model, Model::load(o.path, backend, load));
  Model& model = *out.model;
  const ModelConfig& c = model.config();
  const int32_t loaded = model.n_layers_loaded();
  if (o.load_layers > c.n_layer) {
    return invalid_argument(names.load_layers + ": " + std::to_string(o.load_layers) + " is more than the model's " +
                            std::to_string(c.n_layer) + " layers; use 1.." + std::to_string(c.n_layer) +
                            ", or 0 for all");
  }

  std::optional<ExitHeadSet> heads;
  if (!o.heads_path.empty()) {
    auto read = load_exit_heads(o.heads_path, c);
    if (!read.ok()) return named(names.heads, read.status());
    heads = std::move(*read);
  }
  const ExitPointsSpec spec = o.default_exits ? with_default_exits(o.exits, heads ? &*heads : nullptr) : o.exits;
  // Every 4th layer when nothing named any: its points past the loaded depth go without a word.
  const bool implicit = o.default_exits && o.exits.layers.empty() && o.exits.every == 0 &&
                        (!heads || heads->heads.empty());
  auto resolved = resolve_exit_points(spec, c.n_layer);
  if (!resolved.ok()) return named(names.exits, resolved.status());

  // Points at or past the loaded depth are dropped rather than refused: one spec (every 4th
  // layer) then serves any load_layers, and the loaded depth is always where the last tokens leave.
  std::vector<int32_t> points;
  for (int32_t layer : *resolved) (layer < loaded ? points : out.dropped_exits).push_back(layer);
  if (!out.dropped_exits.empty() && !implicit) {
    out.warning = "exit points " + join_layers(out.dropped_exits) + " are at or past the loaded depth (" +
                  std::to_string(loaded) + " of " + std::to_string(c.n_layer) + " layers); dropped";
  }
  // set_exits copies what it needs from the heads.
  HELIOS_RETURN_IF_ERROR(named(names.exits, model.set_exits(points, heads ? &*heads : nullptr)));
  if (o.default_rule) {
    HELIOS_ASSIGN_OR_RETURN(out.default_rule,
                            resolve_exit_rule(*o.default_rule, model, names.rule_prefix, names.exits_hint));
  }
  return out;
}

StatusOr<ExitRule> resolve_exit_rule(ExitRule rule, const Model& model, std::string_view field_prefix,
                                     std::string_view exits_hint) {
  const std::vector<int32_t>& points = model.exit_layers();
  const int32_t loaded = model.n_layers_loaded();
  const std::string policy = exit_policy_name(rule.policy);
  // Self-speculative may instead draft at the loaded depth, with the heads' lookahead head.
  const bool lookahead = rule.policy == ExitPolicy::kSelfSpeculative && model.has_lookahead();
  if (exit_policy_traits(rule.policy).needs_exit_points && points.empty() && !lookahead) {
    return field_error(field_prefix, "policy", "'" + policy + "' needs exit points, and this model has "
                                               "none below its loaded depth (" + std::to_string(loaded) +
                                               "); " + std::string(exits_hint));
  }
  if (rule.policy == ExitPolicy::kFixedDepth) {
    if (rule.depth == 0) rule.depth = loaded;  // the Helios mode: the loaded prefix is the depth
    if (rule.depth != loaded && std::find(points.begin(), points.end(), rule.depth) == points.end()) {
      return field_error(field_prefix, "depth", "fixed-depth needs an exit point or the loaded depth, got " +
                                                    std::to_string(rule.depth) + "; valid: " +
                                                    (points.empty() ? "" : join_layers(points) + " or ") +
                                                    std::to_string(loaded));
    }
  } else if (rule.policy == ExitPolicy::kSelfSpeculative) {
    if (rule.depth == 0) rule.depth = points.empty() ? loaded : points.front();
    const bool at_lookahead = lookahead && rule.depth == loaded;
    if (!at_lookahead && std::find(points.begin(), points.end(), rule.depth) == points.end()) {
      const std::string valid = join_layers(points) + (lookahead ? (points.empty() ? "" : " or ") +
                                                                       std::to_string(loaded) + " (lookahead head)"
                                                                 : std::string());
      return field_error(field_prefix, "depth", "self-speculative drafts at an exit point" +
                                                    std::string(lookahead ? " or with the lookahead head" : "") +
                                                    ", got " + std::to_string(rule.depth) + "; valid: " + valid);
    }
  }
  // What only the model knows (probes at every exit, ...).
  if (Status s = model.check_exit_rule(rule); !s.ok()) {
    std::string where(field_prefix);
    if (!where.empty() && where.back() == '.') where.pop_back();  // "exit." → "exit"
    return invalid_argument(where + ": this model cannot run policy " + policy + " with measure " +
                            confidence_measure_name(rule.measure) + " (depth " +
                            std::to_string(rule.depth) + "): " + s.message());
  }
  return rule;
}

}  // namespace helios
