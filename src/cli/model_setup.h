// Loading a model for a local command (generate, eval, calibrate): the shared options — model
// file, threads, early exit — turned into the library's setup_model, with progress on stderr.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "helios/model.h"

namespace helios::cli {

// --model, --threads, --load-layers, and the exit points/heads (--exits, --exit-every,
// --exit-min, and --heads unless heads_option is false).
void add_model_options(Args& args, bool heads_option = true);
// --policy, --threshold, --depth, --measure, --draft-tokens.
void add_exit_rule_options(Args& args);

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::string heads_path;  // the sidecar in use; "" for identity heads
  double load_seconds = 0;
};

// Loads the model with its exit points and heads (setup_model; without --exits or --exit-every the
// heads file's layers, else every 4th); prints progress, dropped exits and a summary to stderr.
StatusOr<LoadedModel> load_model(const Args& args);
// The rule from --policy etc., checked against the model (policy names and thresholds may also
// come as lists: `policy_name` and `threshold` pick one). A threshold is a number or "calibrated"
// (the per-exit thresholds of the heads file).
StatusOr<ExitRule> exit_rule_from_args(const Args& args, const Model& model, const std::string& policy_name,
                                       const std::string& threshold);
// "4,8,12" → {4, 8, 12}; INVALID_ARGUMENT naming the option.
StatusOr<std::vector<int32_t>> parse_int_list(const std::string& option, const std::string& text);
StatusOr<std::vector<double>> parse_number_list(const std::string& option, const std::string& text);
std::vector<std::string> split_list(const std::string& text);
// --rope-scaling: "none", "linear:F" or "yarn:F[:CTX]"; "" gives none set (the file's stands).
StatusOr<std::optional<RopeScaling>> parse_rope_scaling(const std::string& text);

}  // namespace helios::cli
