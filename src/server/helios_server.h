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
#include "server/model_group.h"
#include "server/served_model.h"

namespace helios::server {

enum class ServerState { kLoading, kServing, kDraining };


class HeliosServer {
 public:
  // Binds the port (the actual one is port()); serves UNAVAILABLE until set_models().
  static StatusOr<std::unique_ptr<HeliosServer>> start(const HeliosConfig& config,
                                                      MetricsRegistry& metrics);
  virtual ~HeliosServer() = default;
  virtual int port() const = 0;
  // The OpenAI-compatible HTTP API's port (server.http_listen; port 0 there = any free one);
  // 0 when it is off.
  virtual int http_port() const = 0;
  // Hands over the loaded models and model groups and starts serving them (health → SERVING),
  // with the liveness watchdog when server.liveness_timeout_s > 0: while an engine has work and
  // completes no step for that long, health is NOT_SERVING (helios/liveness.h).
  virtual void set_models(std::vector<std::unique_ptr<ServedModel>> models,
                          std::vector<std::unique_ptr<ModelGroup>> groups = {}) = 0;
  // Graceful stop: health NOT_SERVING, new calls UNAVAILABLE, in-flight streams get up to
  // `drain_timeout_s` to finish, the rest end with UNAVAILABLE; then the server stops.
  virtual void drain_and_stop(double drain_timeout_s) = 0;
  // A model's engine faulted (a device error): logged, and health turns NOT_SERVING for good; the
  // engine itself refuses that model's requests with INTERNAL. Safe from any thread.
  virtual void report_fault(const std::string& model, const std::string& error) = 0;
};

}  // namespace helios::server
