// The OpenAI-compatible HTTP API of heliosd, beside gRPC: POST /v1/completions and
// /v1/chat/completions (streamed as server-sent events or not), GET /v1/models and /health, on
// cpp-httplib's thread pool, with the gRPC server's API keys, TLS, limits, queue and drain.
// Requests become the same GenerationRequests gRPC makes (openai_convert.h builds a
// v1::GenerateRequest and to_generation_request validates it), submitted to the same engines.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "helios/config.h"
#include "helios/metrics.h"
#include "server/model_group.h"
#include "server/served_model.h"

namespace helios::server {

// A model or a group, as find_target resolves a request's name.
struct HttpTarget {
  ServedModel* model = nullptr;
  ModelGroup* group = nullptr;
};

// What the HTTP API asks of the server that owns it (HeliosServer's implementation fills it in,
// so that both APIs see one set of models, one state and one set of live request ids).
struct HttpServerAccess {
  // The gRPC handlers' lookup: "" = the default; null in both with UNAVAILABLE (loading,
  // draining) or NOT_FOUND (naming what is served) in *error.
  std::function<HttpTarget(const std::string& model, grpc::Status* error)> find_target;
  std::function<std::vector<ServedModel*>()> models;
  std::function<std::vector<ModelGroup*>()> groups;
  // "serving", "loading", "draining", "faulted" (a device error) or "stalled" (a model's engine has
  // work and completes no step: server.liveness_timeout_s): /health is 200 only when serving.
  std::function<std::string()> state;
  std::function<bool(const std::string& id)> claim_request_id;  // false: the id is in use
  std::function<void(const std::string& id)> release_request_id;
  std::function<void()> count_error;
};

class HttpJob;

class OpenAiHttpServer {
 public:
  // Binds server.http_listen (port 0: any free port; the actual one is port()), with TLS when
  // server.tls is set, and serves on server.http_threads threads. UNAVAILABLE when it cannot.
  static StatusOr<std::unique_ptr<OpenAiHttpServer>> start(const HeliosConfig& config, MetricsRegistry& metrics,
                                                           HttpServerAccess access);
  ~OpenAiHttpServer();  // stop(0)
  OpenAiHttpServer(const OpenAiHttpServer&) = delete;
  OpenAiHttpServer& operator=(const OpenAiHttpServer&) = delete;

  int port() const;
  // For the drain, after the engines' requests have finished (or been ended): waits up to
  // `wait_s` for the HTTP requests still writing their last bytes (a stream's final chunk and
  // [DONE]), ends the engine requests of any left, then stops accepting and joins the threads.
  void stop(double wait_s = 10.0);

 private:
  friend class HttpJob;
  struct Impl;
  explicit OpenAiHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace helios::server
