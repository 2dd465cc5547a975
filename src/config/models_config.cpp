// models: a list of {name, path, rope_scaling, early_exit}; at least one, names unique. Relative paths resolve
// against the directory of the config file, so a config works from any working directory.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr std::string_view kModelsExample =
    "e.g.\n  models:\n    - name: smollm2-135m\n"
    "      path: ../models/SmolLM2-135M-Instruct.Q4_1.gguf";

// rope_scaling: {type, factor, original_context}, replacing the file's rope scaling.
Status read_rope_scaling(const MapReader& model, std::optional<RopeScaling>* out) {
  if (!model.has("rope_scaling")) return ok_status();
  HELIOS_ASSIGN_OR_RETURN(MapReader r, MapReader::open(model.source(), model.value("rope_scaling"),
                                                       model.mark_of("rope_scaling"), model.key_path("rope_scaling"),
                                                       {"type", "factor", "original_context"}));
  if (!r.has("type")) {
    return model.error("rope_scaling", "needs a type (none, linear or yarn), e.g. {type: yarn, factor: 4, "
                                       "original_context: 32768} for Qwen2.5's long context");
  }
  RopeScaling s;
  HELIOS_RETURN_IF_ERROR(r.read_choice<std::string>("type", {{"none", "none"}, {"linear", "linear"}, {"yarn", "yarn"}},
                                                    &s.type));
  HELIOS_RETURN_IF_ERROR(r.read_double("factor", &s.factor));
  HELIOS_RETURN_IF_ERROR(r.read_int("original_context", &s.original_context));
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor)) {
    return r.error("factor", "must be >= 1 (the context grows by it), got " + std::to_string(s.factor));
  }
  if (s.original_context < 0) {
    return r.error("original_context", "must be >= 0 (0: the model's own context_length)");
  }
  if (s.type != "yarn" && r.has("original_context")) {
    return r.error("original_context", "is YaRN's; type is " + s.type);
  }
  *out = s;
  return ok_status();
}

}  // namespace

// One entry of models[] (telemetry null) or model_repository[] (which may have a telemetry map).
Status read_model_entry(const ConfigSource& source, const YAML::Node& node, const std::string& path,
                        ModelEntryConfig* out, ModelTelemetry* telemetry) {
  if (!node.IsMap()) {
    return config_error(source, node.Mark(), path,
                        "expected a map with keys name and path, got " + describe_node(node));
  }
  std::vector<std::string_view> keys = {"name", "path", "rope_scaling", "early_exit"};
  if (telemetry) keys.push_back("telemetry");
  HELIOS_ASSIGN_OR_RETURN(MapReader model, MapReader::open(source, node, node.Mark(), path, keys));
  for (std::string_view key : {"name", "path"}) {
    if (!model.has(key)) {
      return model.error(key, "missing; every model needs a name (what clients ask for) and a "
                              "path (its GGUF file)");
    }
  }
  HELIOS_RETURN_IF_ERROR(model.read_string("name", &out->name));
  const bool name_ok = !out->name.empty() &&
                       std::all_of(out->name.begin(), out->name.end(), [](char c) {
                         return std::isgraph(static_cast<unsigned char>(c)) != 0;
                       });
  if (!name_ok) {
    return model.error("name", "must be a non-empty name without spaces, e.g. smollm2-135m, got '" +
                                   out->name + "'");
  }
  HELIOS_RETURN_IF_ERROR(model.read_string("path", &out->path));
  if (out->path.empty()) {
    return model.error("path", "must be the path of a GGUF file, got an empty string");
  }
  out->path = resolve_path(source, out->path);
  HELIOS_RETURN_IF_ERROR(read_rope_scaling(model, &out->rope_scaling));
  if (telemetry && model.has("telemetry")) {
    HELIOS_ASSIGN_OR_RETURN(MapReader t, MapReader::open(source, model.value("telemetry"), model.mark_of("telemetry"),
                                                         model.key_path("telemetry"),
                                                         {"throughput", "perplexity", "memory"}));
    HELIOS_RETURN_IF_ERROR(t.read_double("throughput", &telemetry->throughput_tok_s));
    HELIOS_RETURN_IF_ERROR(t.read_double("perplexity", &telemetry->perplexity));
    HELIOS_RETURN_IF_ERROR(t.read_byte_size("memory", &telemetry->memory_bytes));
    if (telemetry->throughput_tok_s < 0) return t.error("throughput", "must be >= 0 tokens/s (0 = unknown)");
    if (telemetry->perplexity != 0 && telemetry->perplexity < 1) {
      return t.error("perplexity", "must be >= 1 (a perplexity), or 0 = unknown");
    }
  }
  return read_early_exit_config(model, &out->early_exit);
}

Status read_models_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, std::vector<ModelEntryConfig>* out) {
  if (!node.IsDefined()) {
    return config_error(source, where, "models",
                        "missing; a config needs at least one model, " + std::string(kModelsExample));
  }
  if (node.IsNull()) {
    return config_error(source, where, "models",
                        "has no value; a config needs at least one model, " +
                            std::string(kModelsExample));
  }
  if (!node.IsSequence()) {
    return config_error(source, node.Mark(), "models",
                        "expected a list of {name, path} maps, got " + describe_node(node) + "; " +
                            std::string(kModelsExample));
  }
  if (node.size() == 0) {
    return config_error(source, node.Mark(), "models",
                        "is empty; a config needs at least one model, " +
                            std::string(kModelsExample));
  }
  std::vector<ModelEntryConfig> models(node.size());
  for (size_t i = 0; i < node.size(); ++i) {
    HELIOS_RETURN_IF_ERROR(read_model_entry(source, node[i], "models[" + std::to_string(i) + "]", &models[i], nullptr));
    for (size_t j = 0; j < i; ++j) {
      if (models[j].name == models[i].name) {
        return config_error(source, node[i]["name"].Mark(),
                            "models[" + std::to_string(i) + "].name",
                            "'" + models[i].name + "' is already the name of models[" +
                                std::to_string(j) + "]; model names must be unique");
      }
    }
  }
  *out = std::move(models);
  return ok_status();
}

}  // namespace helios::config_detail
