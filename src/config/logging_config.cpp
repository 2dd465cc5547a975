// logging: level, format.
#include "config/sections.h"

namespace helios::config_detail {

Status read_logging_config(const ConfigSource& source, const YAML::Node& node,
                           const YAML::Mark& where, LoggingConfig* out) {
  HELIOS_ASSIGN_OR_RETURN(MapReader logging,
                          MapReader::open(source, node, where, "logging", {"level", "format"}));
  HELIOS_RETURN_IF_ERROR(logging.read_choice<std::string>(
      "level",
      {{"trace", "trace"}, {"debug", "debug"}, {"info", "info"}, {"warn", "warn"}, {"error", "error"}},
      &out->level));
  HELIOS_RETURN_IF_ERROR(logging.read_choice<LogFormat>(
      "format", {{"text", LogFormat::kText}, {"json", LogFormat::kJson}}, &out->format));
  return ok_status();
}

}  // namespace helios::config_detail
