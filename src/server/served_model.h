// One configured model made ready to serve: its backend, the model, its engine.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "helios/config.h"
#include "helios/engine.h"
#include "helios/metrics.h"

namespace helios::server {

// One configured model, loaded, with its engine.
struct ServedModel {
  ModelEntryConfig entry;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  int32_t context_tokens = 0;  // what one request may use: min(model context, KV capacity)
  ExitRule default_exit;       // entry.early_exit.default_rule resolved against the model
};

// Wraps the backend a model is loaded on (heliosd's fault injection); empty: none.
using BackendWrapper = std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>;

// Loads one model (its first early_exit.load_layers blocks), sets its exit points and heads, checks
// its default exit rule and starts its engine, sizing the KV cache from the config. `on_fault`
// (may be empty) hears of a device error in its engine; `intercepts` is the server's section.
StatusOr<std::unique_ptr<ServedModel>> load_served_model(
    const ModelEntryConfig& entry, const EngineConfig& engine, size_t n_models, MetricsRegistry& metrics,
    std::function<void(const std::string& error)> on_fault = {}, const InterceptConfig& intercepts = {},
    const BackendWrapper& wrap_backend = {});

}  // namespace helios::server
