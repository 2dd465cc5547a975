// models: a list of {name, path, early_exit}; at least one, names unique. Relative paths resolve
// against the directory of the config file, so a config works from any working directory.
#include <algorithm>
#include <cctype>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr std::string_view kModelsExample =
    "e.g.\n  models:\n    - name: smollm2-135m\n"
    "      path: ../models/SmolLM2-135M-Instruct.Q4_1.gguf";

Status read_model(const ConfigSource& source, const YAML::Node& node, size_t index,
                  ModelEntryConfig* out) {
  const std::string path = "models[" + std::to_string(index) + "]";
  if (!node.IsMap()) {
    return config_error(source, node.Mark(), path,
                        "expected a map with keys name and path, got " + describe_node(node));
  }
  HELIOS_ASSIGN_OR_RETURN(MapReader model,
                          MapReader::open(source, node, node.Mark(), path,
                                          {"name", "path", "early_exit"}));
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
  return read_early_exit_config(model, &out->early_exit);
}

}  // namespace

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
    HELIOS_RETURN_IF_ERROR(read_model(source, node[i], i, &models[i]));
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
