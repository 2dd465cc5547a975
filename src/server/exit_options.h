// Early-exit rules at the server's edge: a request's ExitOptions merged onto its model's default
// rule within the limits the config sets, and the rule shown back to clients. Errors name the
// field ("exit.depth: ..."). The default itself is resolved when the model loads (setup_model).
#pragma once

#include <string_view>

#include "helios/config.h"
#include "helios/model.h"
#include "helios/model_setup.h"
#include "helios/v1/helios.pb.h"

namespace helios::server {

// Where a model's exit points are set, for the errors of a rule that needs some.
inline constexpr std::string_view kConfigExitsHint =
    "the server's config sets them in models[].early_exit.exits or exit_every";

// The rule for a request: the model's default with the request's overrides, if `config` lets
// requests make them, resolved and checked against the model (helios::resolve_exit_rule).
StatusOr<ExitRule> exit_rule_for_request(const v1::ExitOptions& options, const EarlyExitConfig& config,
                                         const Model& model);

// A resolved rule as the API shows it (threshold_set true).
void to_exit_options(const ExitRule& rule, v1::ExitOptions* out);

}  // namespace helios::server
