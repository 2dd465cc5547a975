// One reader per config section, each with its own validation (server_config.cpp,
// models_config.cpp, early_exit_config.cpp, engine_config.cpp, limits_config.cpp, logging_config.cpp,
// intercepts_config.cpp).
// config_loader.cpp parses the YAML and hands each section its node.
#pragma once

#include <yaml-cpp/yaml.h>

#include <vector>

#include "config/yaml_section.h"
#include "helios/config.h"

namespace helios::config_detail {

// Each reader starts from the struct's defaults, applies the keys present and validates the
// result. `node` may be undefined or null (section absent: all defaults); `where` is the mark
// errors cite when it is.
Status read_server_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, ServerConfig* out);
Status read_models_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, std::vector<ModelEntryConfig>* out);
Status read_engine_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, EngineConfig* out);
Status read_limits_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, LimitsConfig* out);
Status read_logging_config(const ConfigSource& source, const YAML::Node& node,
                           const YAML::Mark& where, LoggingConfig* out);
Status read_intercepts_config(const ConfigSource& source, const YAML::Node& node,
                              const YAML::Mark& where, InterceptConfig* out);

// One entry of models[] (`telemetry` null) or model_repository[] (with its telemetry map).
Status read_model_entry(const ConfigSource& source, const YAML::Node& node, const std::string& path,
                        ModelEntryConfig* out, ModelTelemetry* telemetry);
// model_repository and groups (groups_config.cpp): names unique, candidates in the repository.
Status read_model_repository(const ConfigSource& source, const YAML::Node& node, const YAML::Mark& where,
                             std::vector<RepositoryModelConfig>* out);
Status read_groups_config(const ConfigSource& source, const YAML::Node& node, const YAML::Mark& where,
                          const std::vector<RepositoryModelConfig>& repository, std::vector<ModelGroupConfig>* out);

// models[i].early_exit, read from the model's own map.
Status read_early_exit_config(const MapReader& model, EarlyExitConfig* out);

// "" when `address` is HOST:PORT, else what is wrong with it.
std::string host_port_problem(std::string_view address);

}  // namespace helios::config_detail
