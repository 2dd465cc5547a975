// Early-exit rules at the server's edge: a model's configured default made concrete at load, a
// request's ExitOptions merged onto it within the limits the config sets, and the rule shown back
// to clients. Errors name the field ("exit.depth: ...", "early_exit.depth: ...").
#pragma once

#include <string_view>

#include "helios/config.h"
#include "helios/model.h"
#include "helios/v1/helios.pb.h"

namespace helios::server {

// `rule` with depth 0 made concrete (fixed-depth: the loaded depth; self-speculative: the first
// exit point), then checked
// with Model::check_exit_rule. INVALID_ARGUMENT naming `field_prefix` + the key ("exit." for a
// request, "early_exit." for the config).
StatusOr<ExitRule> resolve_exit_rule(ExitRule rule, const Model& model, std::string_view field_prefix);

// The rule for a request: the model's default with the request's overrides, if `config` lets
// requests make them, resolved and checked against the model.
StatusOr<ExitRule> exit_rule_for_request(const v1::ExitOptions& options, const EarlyExitConfig& config,
                                         const Model& model);

// A resolved rule as the API shows it (threshold_set true).
void to_exit_options(const ExitRule& rule, v1::ExitOptions* out);

}  // namespace helios::server
