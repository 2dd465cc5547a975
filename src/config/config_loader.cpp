// parse_config / load_config: YAML text → HeliosConfig. Parses the document, checks the top-level
// keys, then hands each section to its reader (sections.h), which validates it.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/eventhandler.h>

#include "config/sections.h"

namespace helios {

namespace {

using config_detail::ConfigSource;
using config_detail::MapReader;

constexpr std::string_view kMinimalConfig =
    "e.g.\n  models:\n    - name: smollm2-135m\n"
    "      path: ../models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
    "(configs/default.yaml lists every key)";

Status syntax_error(const ConfigSource& source, const YAML::Mark& mark, const std::string& what) {
  return invalid_argument(source.file_name + ":" + std::to_string(std::max(mark.line, 0) + 1) +
                          ":" + std::to_string(std::max(mark.column, 0) + 1) +
                          ": invalid YAML: " + what);
}

// Where each document of a YAML text starts (its root node), from yaml-cpp's event parser rather
// than YAML::LoadAll: on a ',' outside [...] or {...}, yaml-cpp 0.7 reads the same empty document
// again and again without moving on, and LoadAll collects them until memory runs out.
class DocumentRoots : public YAML::EventHandler {
 public:
  explicit DocumentRoots(const std::string& text) {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(*this)) {
      if (starts_.size() >= 2 && starts_.back().pos == starts_[starts_.size() - 2].pos) {
        stuck_ = true;
        break;
      }
    }
  }
  bool stuck() const { return stuck_; }  // at starts().back()
  const std::vector<YAML::Mark>& starts() const { return starts_; }
  const std::vector<YAML::Mark>& roots() const { return roots_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    starts_.push_back(mark);
    want_root_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (want_root_) roots_.push_back(mark);
    want_root_ = false;
  }
  std::vector<YAML::Mark> starts_, roots_;
  bool want_root_ = false;
  bool stuck_ = false;
};

StatusOr<HeliosConfig> read_root(const ConfigSource& source, const YAML::Node& root) {
  const YAML::Mark file_start;  // 0:0, printed as 1:1
  if (!root.IsDefined() || root.IsNull()) {
    return config_error(source, file_start, "models",
                        "missing; the file is empty, and a config needs at least one model, " +
                            std::string(kMinimalConfig));
  }
  HELIOS_ASSIGN_OR_RETURN(
      MapReader top, MapReader::open(source, root, file_start, "",
                                     {"server", "models", "model_repository", "groups", "engine", "limits",
                                      "logging", "intercepts"}));
  if (!top.has("models") && !top.has("groups")) {
    return config_error(source, file_start, "models",
                        "missing; a config needs at least one model, " +
                            std::string(kMinimalConfig));
  }
  const auto section = [&](std::string_view key) {
    return top.has(key) ? top.value(key) : YAML::Node();
  };

  HeliosConfig config;
  HELIOS_RETURN_IF_ERROR(config_detail::read_server_config(source, section("server"),
                                                           top.mark_of("server"), &config.server));
  if (top.has("models") || !top.has("groups")) {  // a config of groups alone needs no models
    HELIOS_RETURN_IF_ERROR(config_detail::read_models_config(source, section("models"),
                                                             top.mark_of("models"), &config.models));
  }
  HELIOS_RETURN_IF_ERROR(config_detail::read_model_repository(source, section("model_repository"),
                                                              top.mark_of("model_repository"), &config.model_repository));
  HELIOS_RETURN_IF_ERROR(config_detail::read_groups_config(source, section("groups"), top.mark_of("groups"),
                                                           config.model_repository, &config.groups));
  if (config.models.empty() && config.groups.empty()) {  // `groups:` present but null or []
    return config_error(source, top.mark_of("groups"), "groups",
                        "has no group and there is no models section; a config needs at least one model, " +
                            std::string(kMinimalConfig));
  }
  for (size_t i = 0; i < config.groups.size(); ++i) {
    for (const ModelEntryConfig& m : config.models) {
      if (m.name == config.groups[i].name) {
        return config_error(source, top.value("groups")[i]["name"].Mark(), "groups[" + std::to_string(i) + "].name",
                            "'" + m.name + "' is also the name of a model in models; clients ask for one or the other");
      }
    }
  }
  HELIOS_RETURN_IF_ERROR(config_detail::read_engine_config(source, section("engine"),
                                                           top.mark_of("engine"), &config.engine));
  if (config.engine.tensor_parallel > 1 && !config.groups.empty()) {
    return config_error(source, top.value("engine")["tensor_parallel"].Mark(), "engine.tensor_parallel",
                        "a model group extends and switches models' loaded prefixes, which a model split over " +
                            std::to_string(config.engine.tensor_parallel) +
                            " ranks cannot do; use tensor_parallel: 1 with groups, or serve the models without groups");
  }
  HELIOS_RETURN_IF_ERROR(config_detail::read_limits_config(source, section("limits"),
                                                           top.mark_of("limits"), &config.limits));
  HELIOS_RETURN_IF_ERROR(config_detail::read_logging_config(
      source, section("logging"), top.mark_of("logging"), &config.logging));
  HELIOS_RETURN_IF_ERROR(config_detail::read_intercepts_config(
      source, section("intercepts"), top.mark_of("intercepts"), &config.intercepts));
  return config;
}

}  // namespace

StatusOr<HeliosConfig> parse_config(const std::string& yaml_text, const std::string& file_name) {
  const ConfigSource source{file_name,
                            std::filesystem::path(file_name).parent_path().string()};
  try {
    YAML::Node root;
    try {
      const DocumentRoots documents(yaml_text);
      if (documents.stuck()) {
        return syntax_error(source, documents.starts().back(), "',' outside a flow collection ([...] or {...})");
      }
      if (documents.roots().size() > 1) {
        return syntax_error(source, documents.roots()[1],
                            "a config is one YAML document, but this file has " +
                                std::to_string(documents.roots().size()) + " (separated by '---')");
      }
      root = YAML::Load(yaml_text);  // the one document
    } catch (const YAML::ParserException& e) {
      return syntax_error(source, e.mark, e.msg);
    }
    return read_root(source, root);
  } catch (const YAML::Exception& e) {
    // The readers use only checked accessors; this is a bug, but still not a crash.
    return internal_error(source.file_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                          std::to_string(e.mark.column + 1) + ": reading the config: " + e.msg);
  }
}

StatusOr<HeliosConfig> load_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return not_found("cannot read config file '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found("cannot read config file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return not_found("cannot read config file '" + path + "': " + std::strerror(errno));
  }
  return parse_config(text.str(), path);
}

}  // namespace helios
