// limits: max_tokens, default_max_tokens, max_prompt_tokens (per request), max_n (OpenAI API choices).
#include "config/sections.h"

namespace helios::config_detail {

Status read_limits_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, LimitsConfig* out) {
  HELIOS_ASSIGN_OR_RETURN(
      MapReader limits,
      MapReader::open(source, node, where, "limits",
                      {"max_tokens", "default_max_tokens", "max_prompt_tokens", "max_n"}));
  for (auto [key, field] : {std::pair<std::string_view, int32_t*>{"max_tokens", &out->max_tokens},
                            {"default_max_tokens", &out->default_max_tokens},
                            {"max_prompt_tokens", &out->max_prompt_tokens},
                            {"max_n", &out->max_n}}) {
    HELIOS_RETURN_IF_ERROR(limits.read_int(key, field));
    if (*field < 1) return limits.error(key, "must be at least 1, got " + std::to_string(*field));
  }
  if (out->max_n > 128) {
    return limits.error("max_n", "must be at most 128 (each choice is one request in the queue), got " +
                                     std::to_string(out->max_n));
  }
  if (out->default_max_tokens > out->max_tokens) {
    // Point at whichever of the two the file sets; default_max_tokens when it sets both.
    const std::string_view key =
        limits.has("default_max_tokens") ? "default_max_tokens" : "max_tokens";
    return limits.error(key, "default_max_tokens (" + std::to_string(out->default_max_tokens) +
                                 ") is larger than max_tokens (" +
                                 std::to_string(out->max_tokens) +
                                 "); default_max_tokens must be at most max_tokens");
  }
  return ok_status();
}

}  // namespace helios::config_detail
