// The exit profile of a model and its heads: how often each exit's top-1 is the last layer's, how
// many tokens would leave at each threshold and how many of those would be right, and the Helios
// paper's curve (its Figures 5 and 13) — the share of tokens whose exit prediction is unchanged at
// the last layer, by the exit's confidence. Built from observations (ForwardBatch::observe_exits),
// teacher-forced over text or free-running while generating; the model manager records the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "helios/early_exit.h"
#include "helios/model.h"

namespace helios {

// Observed tokens: per token, each exit's (top-1, probability) and the last layer's top-1.
struct ExitObservations {
  std::vector<int32_t> layers;                      // observed exit layers, ascending
  std::vector<std::vector<ExitObservation>> exits;  // per token: [layers.size()]
  std::vector<int32_t> final_top1;                  // per token

  // Appends every logit row of a full-depth observe pass (rows that left early are skipped).
  void add_pass(const ForwardResult& fr);
  int64_t n_tokens() const { return static_cast<int64_t>(final_top1.size()); }
};

struct ThresholdRow {
  float threshold = 0;
  double leaving = 0;      // share of the tokens whose confidence reaches it
  double agreed = 0;       // share of those whose exit top-1 is the last layer's (1 when none leave)
};
struct ConfidenceBin {
  float low = 0, high = 0;  // top-1 probability in [low, high)
  int64_t n = 0;
  double unchanged = 0;     // share whose exit top-1 is the last layer's
};
struct ExitLayerProfile {
  int32_t layer = 0;
  int64_t n = 0;
  double agreement = 0;                    // exit top-1 == last layer top-1
  std::vector<ThresholdRow> top1;          // by top-1 probability
  std::vector<ThresholdRow> agreement_measure;  // by the head's agreement curve (empty without one)
  std::vector<ConfidenceBin> bins;         // the paper's curve
};
struct ExitProfile {
  std::string mode;  // "teacher-forced" or "free-running"
  std::vector<ExitLayerProfile> layers;
};

// Thresholds 0.1, 0.2, ..., 0.9, 0.95, 0.99 and 10 equal confidence bins. `heads` (may be null)
// supplies each exit's agreement curve.
ExitProfile build_exit_profile(const ExitObservations& obs, const std::string& mode, const ExitHeadSet* heads);

std::string exit_profile_markdown(const std::vector<ExitProfile>& profiles);
std::string exit_profile_json(const std::vector<ExitProfile>& profiles);

}  // namespace helios
