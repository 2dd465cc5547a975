#include "server/exit_options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace helios::server {
namespace {

Status field_error(std::string_view prefix, std::string_view key, const std::string& what) {
  return invalid_argument(std::string(prefix) + std::string(key) + ": " + what);
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string policy_names(const std::vector<ExitPolicy>& policies) {
  std::string out;
  for (ExitPolicy p : policies) out += (out.empty() ? "" : ", ") + std::string(exit_policy_name(p));
  return out;
}

// Policy and measure names: the spellings early_exit.h gives, listed when one is unknown.
StatusOr<ExitPolicy> policy_from_name(const std::string& name) {
  auto policy = parse_exit_policy(name);
  if (policy.ok()) return policy;
  return field_error("exit.", "policy", "unknown policy '" + name + "'; valid: " + exit_policy_names());
}

StatusOr<ConfidenceMeasure> measure_from_name(const std::string& name) {
  auto measure = parse_confidence_measure(name);
  if (measure.ok()) return measure;
  return field_error("exit.", "measure", "unknown measure '" + name + "'; valid: " + confidence_measure_names());
}

// A server with allow_request_override off takes only options that leave its default as it is,
// so clients that always send their settings keep working against it.
Status check_unchanged(const ExitRule& merged, const ExitRule& def) {
  std::string_view key;
  if (merged.policy != def.policy) key = "policy";
  else if (merged.measure != def.measure) key = "measure";
  else if (merged.threshold != def.threshold || merged.calibrated_thresholds != def.calibrated_thresholds) {
    key = "threshold";
  }
  else if (merged.depth != def.depth) key = "depth";
  else if (merged.draft_tokens != def.draft_tokens) key = "draft_tokens";
  else if (merged.draft_vocab != def.draft_vocab) key = "draft_vocab";
  if (key.empty()) return ok_status();
  return field_error("exit.", key, "this server does not let requests change this model's exit rule "
                                   "(its early_exit.allow_request_override is false); leave exit unset "
                                   "to get the default (GetModelInfo.default_exit)");
}

}  // namespace

StatusOr<ExitRule> exit_rule_for_request(const v1::ExitOptions& o, const EarlyExitConfig& config,
                                         const Model& model) {
  ExitRule rule = config.default_rule;
  if (!o.policy().empty()) {
    HELIOS_ASSIGN_OR_RETURN(rule.policy, policy_from_name(o.policy()));
  }
  if (!o.measure().empty()) {
    HELIOS_ASSIGN_OR_RETURN(rule.measure, measure_from_name(o.measure()));
  }
  const bool threshold_given = o.threshold_set() || o.threshold() != 0;
  if (threshold_given) {
    if (!(o.threshold() >= 0 && o.threshold() <= 1)) {  // NaN fails too
      return field_error("exit.", "threshold", "must be in [0, 1] (1 = never early), got " + num(o.threshold()));
    }
    rule.threshold = o.threshold();
  }
  if (o.calibrated_thresholds()) rule.calibrated_thresholds = true;
  if (o.depth() < 0) {
    return field_error("exit.", "depth", "must be >= 0 (0 = the model's default), got " + std::to_string(o.depth()));
  }
  if (o.depth() > 0) rule.depth = o.depth();
  if (o.draft_tokens() != 0) {
    if (o.draft_tokens() < 1 || o.draft_tokens() > kMaxDraftTokens) {
      return field_error("exit.", "draft_tokens", "must be in 1.." + std::to_string(kMaxDraftTokens) +
                                                      " (0 = the model's default), got " +
                                                      std::to_string(o.draft_tokens()));
    }
    rule.draft_tokens = o.draft_tokens();
  }
  if (o.draft_vocab() != 0) {
    if (o.draft_vocab() < 0 || o.draft_vocab() % 64 != 0) {
      return field_error("exit.", "draft_vocab", "must be a multiple of 64 (0 = the model's default), got " +
                                                     std::to_string(o.draft_vocab()));
    }
    rule.draft_vocab = o.draft_vocab();
  }

  // The server's limits.
  if (!config.allow_request_override) {
    HELIOS_RETURN_IF_ERROR(check_unchanged(rule, config.default_rule));
  }
  const auto& allowed = config.allowed_policies;
  if (!o.policy().empty() && !allowed.empty() &&
      std::find(allowed.begin(), allowed.end(), rule.policy) == allowed.end()) {
    return field_error("exit.", "policy", "'" + o.policy() + "' is not allowed on this server; allowed: " +
                                              policy_names(allowed));
  }
  if (threshold_given && rule.threshold < config.min_threshold) {
    return field_error("exit.", "threshold", num(rule.threshold) + " is below this server's minimum " +
                                                 num(config.min_threshold));
  }
  return resolve_exit_rule(rule, model, "exit.", kConfigExitsHint);
}

void to_exit_options(const ExitRule& rule, v1::ExitOptions* out) {
  out->set_policy(exit_policy_name(rule.policy));
  out->set_measure(confidence_measure_name(rule.measure));
  out->set_threshold(rule.threshold);
  out->set_threshold_set(true);
  out->set_calibrated_thresholds(rule.calibrated_thresholds);
  out->set_depth(rule.depth);
  out->set_draft_tokens(rule.draft_tokens);
  out->set_draft_vocab(rule.draft_vocab);
}

}  // namespace helios::server
