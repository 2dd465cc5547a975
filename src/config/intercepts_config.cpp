// intercepts: hold, pause_priors, profile_at_start, paused_idle_timeout_s.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr HoldPolicy kHoldPolicies[] = {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve,
                                        HoldPolicy::kSwap, HoldPolicy::kMinWaste};

// pause_priors: kind → seconds. The kinds are open-ended (a client names the kind of its pause),
// so the map's own keys are its known keys; MapReader still gives the duplicate-key check and the
// typed reads with their messages.
Status read_pause_priors(const MapReader& intercepts, std::map<std::string, double>* out) {
  if (!intercepts.has("pause_priors")) return ok_status();
  const YAML::Node& node = intercepts.value("pause_priors");
  if (node.IsNull()) return ok_status();  // `pause_priors:` alone: the defaults
  if (!node.IsMap()) {
    return intercepts.error("pause_priors",
                            "expected a map of kind: seconds, e.g. {chatbot: 28.6, qa: 0.69}, got " +
                                describe_node(node));
  }
  std::vector<std::string> kinds;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    if (key.IsScalar()) kinds.push_back(key.Scalar());
  }
  const std::vector<std::string_view> known(kinds.begin(), kinds.end());
  HELIOS_ASSIGN_OR_RETURN(MapReader priors,
                          MapReader::open(intercepts.source(), node, intercepts.mark_of("pause_priors"),
                                          intercepts.key_path("pause_priors"), known));
  for (const std::string& kind : kinds) {
    if (kind.empty()) {
      return config_error(intercepts.source(), priors.mark_of(kind), intercepts.key_path("pause_priors"),
                          "a kind needs a name, got an empty key");
    }
    double seconds = 0;
    HELIOS_RETURN_IF_ERROR(priors.read_double(kind, &seconds));
    if (seconds < 0) {
      return priors.error(kind, "must be at least 0 seconds, got " + priors.value(kind).Scalar());
    }
    (*out)[kind] = seconds;  // a given kind overrides its default; a new one is added
  }
  return ok_status();
}

}  // namespace

Status read_intercepts_config(const ConfigSource& source, const YAML::Node& node, const YAML::Mark& where,
                              InterceptConfig* out) {
  HELIOS_ASSIGN_OR_RETURN(
      MapReader intercepts,
      MapReader::open(source, node, where, "intercepts",
                      {"hold", "pause_priors", "profile_at_start", "paused_idle_timeout_s"}));

  std::vector<std::pair<std::string_view, HoldPolicy>> holds;
  for (HoldPolicy p : kHoldPolicies) holds.emplace_back(hold_policy_name(p), p);
  HELIOS_RETURN_IF_ERROR(intercepts.read_choice("hold", holds, &out->default_hold));

  HELIOS_RETURN_IF_ERROR(read_pause_priors(intercepts, &out->pause_priors));

  HELIOS_RETURN_IF_ERROR(intercepts.read_bool("profile_at_start", &out->profile_at_start));

  HELIOS_RETURN_IF_ERROR(intercepts.read_double("paused_idle_timeout_s", &out->paused_idle_timeout_s));
  if (!(out->paused_idle_timeout_s > 0)) {
    return intercepts.error("paused_idle_timeout_s", "must be more than 0 seconds, got " +
                                                         intercepts.value("paused_idle_timeout_s").Scalar());
  }
  return ok_status();
}

}  // namespace helios::config_detail
