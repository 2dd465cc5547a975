// model_repository and groups: the models the manager may choose from, and the names clients ask
// for, each with its SLO and the Helios paper's parameters (defaults as in the paper: Top-3,
// 5 evaluation requests per candidate, CBCmax 50 over 100 tokens, RI 150).
#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr std::string_view kGroupExample =
    "e.g.\n  groups:\n    - name: coder\n      candidates: [qwen-0.5b, qwen-1.5b]\n      slo: throughput";

Status read_positive(const MapReader& g, std::string_view key, int32_t max, int32_t* out) {
  HELIOS_RETURN_IF_ERROR(g.read_int(key, out));
  if (*out < 1 || *out > max) {
    return g.error(key, "must be between 1 and " + std::to_string(max) + ", got " + std::to_string(*out));
  }
  return ok_status();
}

Status read_group(const ConfigSource& source, const YAML::Node& node, size_t index,
                  const std::vector<RepositoryModelConfig>& repository, ModelGroupConfig* out) {
  const std::string path = "groups[" + std::to_string(index) + "]";
  if (!node.IsMap()) {
    return config_error(source, node.Mark(), path, "expected a map with at least a name, got " + describe_node(node));
  }
  HELIOS_ASSIGN_OR_RETURN(
      MapReader g, MapReader::open(source, node, node.Mark(), path,
                                   {"name", "candidates", "slo", "top_k", "memory_budget", "measure", "threshold",
                                    "evaluation_requests", "prefix_coverage", "cbc_window", "cbc_max",
                                    "reassess_every", "extend_kv"}));
  if (!g.has("name")) return g.error("name", "missing; a group needs the name clients ask for");
  HELIOS_RETURN_IF_ERROR(g.read_string("name", &out->name));
  if (out->name.empty() || out->name.find(' ') != std::string::npos) {
    return g.error("name", "must be a non-empty name without spaces, got '" + out->name + "'");
  }
  HELIOS_RETURN_IF_ERROR(g.read_string_list("candidates", &out->candidates));
  std::vector<std::string_view> names;
  for (const RepositoryModelConfig& m : repository) names.push_back(m.model.name);
  for (size_t i = 0; i < out->candidates.size(); ++i) {
    bool found = false;
    for (std::string_view n : names) found = found || n == out->candidates[i];
    if (!found) {
      const std::string near = closest_match(out->candidates[i], names);
      return config_error(source, g.value("candidates")[i].Mark(), g.key_path("candidates") + "[" + std::to_string(i) + "]",
                          "'" + out->candidates[i] + "' is not in model_repository (" +
                              (names.empty() ? std::string("which is empty") : "it has " + join(names)) + ")" +
                              (near.empty() ? "" : "; did you mean '" + near + "'?"));
    }
  }
  if (out->candidates.empty() && repository.empty()) {
    return g.error("candidates", "the group has no candidates: model_repository is empty; " + std::string(kGroupExample));
  }
  HELIOS_RETURN_IF_ERROR(g.read_choice<SloMode>("slo",
                                                {{"throughput", SloMode::kThroughput},
                                                 {"latency", SloMode::kLatency},
                                                 {"accuracy", SloMode::kAccuracy},
                                                 {"energy", SloMode::kEnergy}},
                                                &out->params.slo));
  HELIOS_RETURN_IF_ERROR(read_positive(g, "top_k", 16, &out->top_k));
  HELIOS_RETURN_IF_ERROR(g.read_byte_size("memory_budget", &out->memory_budget_bytes));
  if (out->memory_budget_bytes < 0) return g.error("memory_budget", "must be a size such as 2GiB (or 0: automatic)");
  HELIOS_RETURN_IF_ERROR(g.read_choice<ConfidenceMeasure>(
      "measure", {{"top1", ConfidenceMeasure::kTop1Prob}, {"agreement", ConfidenceMeasure::kAgreement}}, &out->measure));
  if (g.has("threshold")) {
    double t = 0;
    HELIOS_RETURN_IF_ERROR(g.read_double("threshold", &t));
    if (t <= 0 || t > 1) return g.error("threshold", "must be in (0, 1] (a confidence), got " + std::to_string(t));
    out->params.threshold = static_cast<float>(t);
  }
  if (g.has("prefix_coverage")) {
    HELIOS_RETURN_IF_ERROR(g.read_double("prefix_coverage", &out->params.prefix_coverage));
    if (out->params.prefix_coverage <= 0 || out->params.prefix_coverage > 1) {
      return g.error("prefix_coverage", "must be in (0, 1]: the share of tokens the loaded prefix must serve");
    }
  }
  HELIOS_RETURN_IF_ERROR(read_positive(g, "evaluation_requests", 10000, &out->params.evaluation_requests));
  HELIOS_RETURN_IF_ERROR(read_positive(g, "cbc_window", 100000, &out->params.cbc_window));
  HELIOS_RETURN_IF_ERROR(g.read_int("cbc_max", &out->params.cbc_max));
  if (out->params.cbc_max < 0 || out->params.cbc_max >= out->params.cbc_window) {
    return g.error("cbc_max", "must be between 0 and cbc_window - 1 (" + std::to_string(out->params.cbc_window - 1) +
                                  "), got " + std::to_string(out->params.cbc_max));
  }
  HELIOS_RETURN_IF_ERROR(g.read_choice<bool>("extend_kv", {{"fill", false}, {"recompute", true}}, &out->extend_recompute));
  HELIOS_RETURN_IF_ERROR(g.read_int("reassess_every", &out->params.reassess_every));
  if (out->params.reassess_every < 0) return g.error("reassess_every", "must be >= 0 requests (0: never)");
  return ok_status();
}

}  // namespace

Status read_model_repository(const ConfigSource& source, const YAML::Node& node, const YAML::Mark& where,
                             std::vector<RepositoryModelConfig>* out) {
  if (!node.IsDefined() || node.IsNull()) return ok_status();
  if (!node.IsSequence()) {
    return config_error(source, node.IsDefined() ? node.Mark() : where, "model_repository",
                        "expected a list of {name, path, early_exit, telemetry} maps, got " + describe_node(node));
  }
  out->resize(node.size());
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "model_repository[" + std::to_string(i) + "]";
    HELIOS_RETURN_IF_ERROR(read_model_entry(source, node[i], path, &(*out)[i].model, &(*out)[i].telemetry));
    for (size_t j = 0; j < i; ++j) {
      if ((*out)[j].model.name == (*out)[i].model.name) {
        return config_error(source, node[i]["name"].Mark(), path + ".name",
                            "'" + (*out)[i].model.name + "' is already the name of model_repository[" +
                                std::to_string(j) + "]; names must be unique");
      }
    }
  }
  return ok_status();
}

Status read_groups_config(const ConfigSource& source, const YAML::Node& node, const YAML::Mark& where,
                          const std::vector<RepositoryModelConfig>& repository, std::vector<ModelGroupConfig>* out) {
  if (!node.IsDefined() || node.IsNull()) return ok_status();
  if (!node.IsSequence()) {
    return config_error(source, node.IsDefined() ? node.Mark() : where, "groups",
                        "expected a list of group maps, got " + describe_node(node) + "; " + std::string(kGroupExample));
  }
  out->resize(node.size());
  for (size_t i = 0; i < node.size(); ++i) {
    HELIOS_RETURN_IF_ERROR(read_group(source, node[i], i, repository, &(*out)[i]));
    for (size_t j = 0; j < i; ++j) {
      if ((*out)[j].name == (*out)[i].name) {
        return config_error(source, node[i]["name"].Mark(), "groups[" + std::to_string(i) + "].name",
                            "'" + (*out)[i].name + "' is already the name of groups[" + std::to_string(j) +
                                "]; names must be unique");
      }
    }
  }
  return ok_status();
}

}  // namespace helios::config_detail
