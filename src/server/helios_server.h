// The gRPC front end: the Helios service, health and reflection on one port, with optional TLS
// and API keys. Handlers translate and enqueue; the engines do the work.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

enum class ServerState { kLoading, kServing, kDraining };

class HeliosServer {
 public:
  // Binds the port (the actual one is port()); serves UNAVAILABLE until set_models().
  static StatusOr<std::unique_ptr<HeliosServer>> start(const HeliosConfig& config,
                                                      MetricsRegistry& metrics);
  virtual ~HeliosServer() = default;
  virtual int port() const = 0;
  // Hands over the loaded models and starts serving them (health → SERVING).
  virtual void set_models(std::vector<std::unique_ptr<ServedModel>> models) = 0;
  // Graceful stop: health NOT_SERVING, new calls UNAVAILABLE, in-flight streams get up to
  // `drain_timeout_s` to finish, the rest end with UNAVAILABLE; then the server stops.
  virtual void drain_and_stop(double drain_timeout_s) = 0;
  // A model's engine faulted (a device error): logged, and health turns NOT_SERVING for good; the
  // engine itself refuses that model's requests with INTERNAL. Safe from any thread.
  virtual void report_fault(const std::string& model, const std::string& error) = 0;
};

// Loads one model (its first early_exit.load_layers blocks), sets its exit points and heads, checks
// its default exit rule and starts its engine, sizing the KV cache from the config. `on_fault`
// (may be empty) hears of a device error in its engine.
StatusOr<std::unique_ptr<ServedModel>> load_served_model(
    const ModelEntryConfig& entry, const EngineConfig& engine, size_t n_models, MetricsRegistry& metrics,
    std::function<void(const std::string& error)> on_fault = {});

}  // namespace helios::server
