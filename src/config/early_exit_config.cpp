// models[].early_exit: policy, measure, threshold, depth, draft_tokens, exits / exit_every /
// exit_min_layer, heads, load_layers and the limits on what requests may change. Checks what can
// be checked without the model; the layers themselves are checked against it when it loads.
#include <algorithm>
#include <cstdio>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

// The names come from early_exit.h, so config and API accept the same spellings.
std::vector<std::pair<std::string_view, ExitPolicy>> policy_choices() {
  std::vector<std::pair<std::string_view, ExitPolicy>> out;
  for (ExitPolicy p : kExitPolicies) out.emplace_back(exit_policy_name(p), p);
  return out;
}

std::vector<std::pair<std::string_view, ConfidenceMeasure>> measure_choices() {
  std::vector<std::pair<std::string_view, ConfidenceMeasure>> out;
  for (ConfidenceMeasure m : kConfidenceMeasures) out.emplace_back(confidence_measure_name(m), m);
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// A threshold-like key: a number in [0, 1].
Status read_unit_interval(const MapReader& ee, std::string_view key, std::string_view meaning,
                          float* out) {
  if (!ee.has(key)) return ok_status();
  double value = 0;
  HELIOS_RETURN_IF_ERROR(ee.read_double(key, &value));
  if (value < 0 || value > 1) {
    return ee.error(key, "must be between 0 and 1 (" + std::string(meaning) + "), got " + num(value));
  }
  *out = static_cast<float>(value);
  return ok_status();
}

Status read_allowed_policies(const MapReader& ee, std::vector<ExitPolicy>* out) {
  std::vector<std::string> names;
  HELIOS_RETURN_IF_ERROR(ee.read_string_list("allowed_policies", &names));
  std::vector<std::string_view> valid;
  for (ExitPolicy p : kExitPolicies) valid.push_back(exit_policy_name(p));
  out->clear();
  for (size_t i = 0; i < names.size(); ++i) {
    bool found = false;
    for (ExitPolicy p : kExitPolicies) {
      if (names[i] == exit_policy_name(p)) {
        out->push_back(p);
        found = true;
      }
    }
    if (!found) {
      return config_error(ee.source(), ee.value("allowed_policies")[i].Mark(),
                          ee.key_path("allowed_policies") + "[" + std::to_string(i) + "]",
                          MapReader::choice_error(names[i], valid));
    }
  }
  return ok_status();
}

Status read_exit_points(const MapReader& ee, ExitPointsSpec* out) {
  HELIOS_RETURN_IF_ERROR(ee.read_int_list("exits", &out->layers));
  for (size_t i = 0; i < out->layers.size(); ++i) {
    if (out->layers[i] < 1) {
      return config_error(ee.source(), ee.value("exits")[i].Mark(),
                          ee.key_path("exits") + "[" + std::to_string(i) + "]",
                          "must be at least 1 (an exit after that many layers), got " +
                              std::to_string(out->layers[i]));
    }
  }
  HELIOS_RETURN_IF_ERROR(ee.read_int("exit_every", &out->every));
  if (out->every < 0) {
    return ee.error("exit_every", "must be at least 0 (0 = use exits), got " +
                                      std::to_string(out->every));
  }
  HELIOS_RETURN_IF_ERROR(ee.read_int("exit_min_layer", &out->min_layer));
  if (out->min_layer < 1) {
    return ee.error("exit_min_layer", "must be at least 1, got " + std::to_string(out->min_layer));
  }
  if (!out->layers.empty() && out->every > 0) {
    return ee.error("exit_every", "is set together with exits; give either exits (a list of "
                                  "layers) or exit_every (every k-th layer), not both");
  }
  return ok_status();
}

// Checks that need several keys: each error points at the key most likely to be wrong.
Status check_consistency(const MapReader& ee, const EarlyExitConfig& c) {
  const ExitRule& rule = c.default_rule;
  const std::string policy = exit_policy_name(rule.policy);
  const bool has_exits = !c.exits.layers.empty() || c.exits.every > 0;
  // Self-speculative drafts at an exit point, or at the model's depth with the heads' lookahead head.
  const bool needs_exits = rule.policy == ExitPolicy::kPerToken ||
                           rule.policy == ExitPolicy::kBatchSync ||
                           (rule.policy == ExitPolicy::kSelfSpeculative && c.heads_path.empty());
  if (needs_exits && !has_exits) {
    if (rule.policy == ExitPolicy::kSelfSpeculative) {
      return ee.error("policy", "'self-speculative' drafts at an exit point or with a lookahead head; set exits "
                                "(e.g. [8, 16, 24]), or heads to a file from `helios calibrate --lookahead` with "
                                "depth: the model's layer count");
    }
    return ee.error("policy", "'" + policy + "' needs exit points; set exits (e.g. [8, 16, 24]) "
                              "or exit_every (e.g. 4), or use policy: full");
  }
  if (rule.measure == ConfidenceMeasure::kProbe && c.heads_path.empty()) {
    return ee.error("measure", "'probe' needs the probes of a calibrated sidecar; set heads to the "
                               "file `helios calibrate` writes, or use top1, margin, entropy or "
                               "saturation");
  }
  if (rule.policy == ExitPolicy::kSelfSpeculative && c.load_layers > 0) {
    return ee.error("load_layers", "is " + std::to_string(c.load_layers) +
                                       ", but self-speculative verifies drafts with the full model; "
                                       "set load_layers: 0 or use another policy");
  }
  if (c.load_layers > 0 && rule.depth > c.load_layers) {
    return ee.error("depth", std::to_string(rule.depth) + " is deeper than load_layers (" +
                                 std::to_string(c.load_layers) + "); lower depth or load more layers");
  }
  if (rule.threshold < c.min_threshold) {
    const std::string_view key = ee.has("threshold") ? "threshold" : "min_threshold";
    return ee.error(key, "threshold (" + num(rule.threshold) + ") is below min_threshold (" +
                             num(c.min_threshold) + "); the default must be one requests may ask for");
  }
  if (!c.allowed_policies.empty() &&
      std::find(c.allowed_policies.begin(), c.allowed_policies.end(), rule.policy) ==
          c.allowed_policies.end()) {
    return ee.error("allowed_policies", "does not include the default policy '" + policy +
                                            "'; add it, or change policy");
  }
  return ok_status();
}

}  // namespace

Status read_early_exit_config(const MapReader& model, EarlyExitConfig* out) {
  if (!model.has("early_exit")) return ok_status();
  HELIOS_ASSIGN_OR_RETURN(
      MapReader ee,
      MapReader::open(model.source(), model.value("early_exit"), model.mark_of("early_exit"),
                      model.key_path("early_exit"),
                      {"policy", "measure", "threshold", "calibrated_thresholds", "depth", "draft_tokens", "draft_vocab", "exits",
                       "exit_every", "exit_min_layer", "heads", "load_layers",
                       "allow_request_override", "allowed_policies", "min_threshold"}));
  ExitRule& rule = out->default_rule;
  HELIOS_RETURN_IF_ERROR(ee.read_choice("policy", policy_choices(), &rule.policy));
  HELIOS_RETURN_IF_ERROR(ee.read_choice("measure", measure_choices(), &rule.measure));
  HELIOS_RETURN_IF_ERROR(read_unit_interval(
      ee, "threshold", "a token leaves when its confidence >= threshold; 1 = never early",
      &rule.threshold));

  HELIOS_RETURN_IF_ERROR(ee.read_bool("calibrated_thresholds", &rule.calibrated_thresholds));
  HELIOS_RETURN_IF_ERROR(ee.read_int("depth", &rule.depth));
  if (rule.depth < 0) {
    return ee.error("depth", "must be at least 0 (0 = the loaded depth for fixed-depth, the "
                             "first exit point for self-speculative), got " + std::to_string(rule.depth));
  }
  HELIOS_RETURN_IF_ERROR(ee.read_int("draft_tokens", &rule.draft_tokens));
  if (rule.draft_tokens < 1 || rule.draft_tokens > kMaxDraftTokens) {
    return ee.error("draft_tokens", "must be between 1 and " + std::to_string(kMaxDraftTokens) +
                                        ", got " + std::to_string(rule.draft_tokens));
  }
  HELIOS_RETURN_IF_ERROR(ee.read_int("draft_vocab", &rule.draft_vocab));
  if (rule.draft_vocab < 0 || rule.draft_vocab % 64 != 0) {
    return ee.error("draft_vocab", "must be 0 (the whole vocabulary) or a multiple of 64 (e.g. 32768), got " +
                                       std::to_string(rule.draft_vocab));
  }

  HELIOS_RETURN_IF_ERROR(read_exit_points(ee, &out->exits));

  HELIOS_RETURN_IF_ERROR(ee.read_string("heads", &out->heads_path));
  if (!out->heads_path.empty()) out->heads_path = resolve_path(ee.source(), out->heads_path);

  HELIOS_RETURN_IF_ERROR(ee.read_int("load_layers", &out->load_layers));
  if (out->load_layers < 0) {
    return ee.error("load_layers", "must be at least 0 (0 = all layers), got " +
                                       std::to_string(out->load_layers));
  }

  HELIOS_RETURN_IF_ERROR(ee.read_bool("allow_request_override", &out->allow_request_override));
  HELIOS_RETURN_IF_ERROR(read_allowed_policies(ee, &out->allowed_policies));
  HELIOS_RETURN_IF_ERROR(read_unit_interval(
      ee, "min_threshold", "requests may not ask for a lower threshold", &out->min_threshold));
  return check_consistency(ee, *out);
}

}  // namespace helios::config_detail
