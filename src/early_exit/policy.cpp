// Exit policy and confidence measure names, and where the exits are.
#include <algorithm>
#include <string>
#include <vector>

#include "helios/early_exit.h"

namespace helios {
namespace {

// "a, b, c": the names a parse error offers.
template <typename Enum, size_t N, typename NameOf>
std::string joined_names(const Enum (&values)[N], NameOf name_of) {
  std::string out;
  for (Enum v : values) {
    if (!out.empty()) out += ", ";
    out += name_of(v);
  }
  return out;
}

}  // namespace

std::string exit_policy_names() { return joined_names(kExitPolicies, exit_policy_name); }

std::string confidence_measure_names() { return joined_names(kConfidenceMeasures, confidence_measure_name); }

// clang-format off
constexpr ExitPolicyTraits kTraits[] = {
  //  policy                        name                confident together depth  uses_d needs_p fills  drafts
  {ExitPolicy::kFull,            "full",             false,    false,   false, false, false,  false, false},
  {ExitPolicy::kPerToken,        "per-token",        true,     false,   false, false, true,   true,  false},
  {ExitPolicy::kBatchSync,       "batch-sync",       true,     true,    false, false, true,   true,  false},
  // Fixed-depth: every token of the sequence leaves at `depth`, so no deeper layer ever reads it.
  {ExitPolicy::kFixedDepth,      "fixed-depth",      false,    false,   true,  true,  false,  false, false},
  {ExitPolicy::kSelfSpeculative, "self-speculative", false,    false,   false, true,  true,   false, true},
};
// clang-format on

const ExitPolicyTraits& exit_policy_traits(ExitPolicy policy) {
  for (const ExitPolicyTraits& t : kTraits) {
    if (t.policy == policy) return t;
  }
  return kTraits[0];
}

const char* exit_policy_name(ExitPolicy policy) { return exit_policy_traits(policy).name; }

ExitCheck exit_check_at(const ExitRule& rule, int32_t layer) {
  const ExitPolicyTraits& t = exit_policy_traits(rule.policy);
  if (t.leaves_at_depth) return rule.depth == layer ? ExitCheck::kForced : ExitCheck::kNone;
  if (t.leaves_when_confident && rule.threshold_at(layer) < 1.0f) return ExitCheck::kConfidence;
  return ExitCheck::kNone;
}

std::vector<uint8_t> decide_exits(int32_t layer, const std::vector<ExitRow>& rows) {
  // Batch-sync rows leave together: all of them must be checked here and confident.
  bool together = true;
  for (const ExitRow& r : rows) {
    if (!exit_policy_traits(r.rule->policy).leaves_together) continue;
    together = together && exit_check_at(*r.rule, layer) == ExitCheck::kConfidence &&
               r.rule->confident(layer, r.confidence);
  }
  std::vector<uint8_t> leaves(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const ExitRule& rule = *rows[i].rule;
    switch (exit_check_at(rule, layer)) {
      case ExitCheck::kNone: break;
      case ExitCheck::kForced: leaves[i] = 1; break;
      case ExitCheck::kConfidence:
        leaves[i] = exit_policy_traits(rule.policy).leaves_together ? together
                                                                    : rule.confident(layer, rows[i].confidence);
        break;
    }
  }
  return leaves;
}

StatusOr<ExitPolicy> parse_exit_policy(const std::string& name) {
  for (ExitPolicy p : kExitPolicies) {
    if (name == exit_policy_name(p)) return p;
  }
  return invalid_argument("unknown exit policy '" + name + "'; valid: " +
                          exit_policy_names());
}

const char* confidence_measure_name(ConfidenceMeasure measure) {
  switch (measure) {
    case ConfidenceMeasure::kTop1Prob: return "top1";
    case ConfidenceMeasure::kMargin: return "margin";
    case ConfidenceMeasure::kEntropy: return "entropy";
    case ConfidenceMeasure::kProbe: return "probe";
    case ConfidenceMeasure::kSaturation: return "saturation";
    case ConfidenceMeasure::kAgreement: return "agreement";
  }
  return "unknown";
}

StatusOr<ConfidenceMeasure> parse_confidence_measure(const std::string& name) {
  for (ConfidenceMeasure m : kConfidenceMeasures) {
    if (name == confidence_measure_name(m)) return m;
  }
  return invalid_argument("unknown confidence measure '" + name + "'; valid: " +
                          confidence_measure_names());
}

bool is_cheap_measure(ConfidenceMeasure measure) {
  return measure == ConfidenceMeasure::kProbe || measure == ConfidenceMeasure::kSaturation;
}

StatusOr<std::vector<int32_t>> resolve_exit_points(const ExitPointsSpec& spec, int32_t n_layers) {
  if (spec.every < 0) {
    return invalid_argument("exit spacing 'every' must be >= 0 (got " + std::to_string(spec.every) + ")");
  }
  if (spec.min_layer < 1) {
    return invalid_argument("exit min_layer must be >= 1 (got " + std::to_string(spec.min_layer) + ")");
  }
  // Layer n_layers is the model's own head, so exits stop one short of it.
  const int32_t last_exit = n_layers - 1;
  std::vector<int32_t> layers;
  for (int32_t layer : spec.layers) {
    if (layer < 1 || layer > last_exit) {
      return invalid_argument("exit layer " + std::to_string(layer) + " is out of range: this model has " +
                              std::to_string(n_layers) + " layers, so exits must be in [1, " +
                              std::to_string(last_exit) + "]");
    }
    layers.push_back(layer);
  }
  if (spec.every > 0) {
    for (int64_t layer = spec.min_layer; layer <= last_exit; layer += spec.every) {
      layers.push_back(static_cast<int32_t>(layer));
    }
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

}  // namespace helios
