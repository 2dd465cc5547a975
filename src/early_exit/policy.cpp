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

const char* exit_policy_name(ExitPolicy policy) {
  switch (policy) {
    case ExitPolicy::kFull: return "full";
    case ExitPolicy::kPerToken: return "per-token";
    case ExitPolicy::kBatchSync: return "batch-sync";
    case ExitPolicy::kFixedDepth: return "fixed-depth";
    case ExitPolicy::kSelfSpeculative: return "self-speculative";
  }
  return "unknown";
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
