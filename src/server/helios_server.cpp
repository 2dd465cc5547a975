// gRPC handlers: check the caller, find the model, convert, enqueue, stream. Nothing else.
#include "server/helios_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "helios/v1/helios.grpc.pb.h"
#include "server/exit_options.h"
#include "server/liveness_watchdog.h"
#include "server/model_group.h"
#include "server/openai_http.h"
#include "server/request_convert.h"
#include "server/session.h"

namespace helios::server {
namespace {

using grpc::ServerContext;
using grpc::StatusCode;
using Clock = std::chrono::steady_clock;

constexpr const char* kServiceName = "helios.v1.Helios";

grpc::Status to_grpc(const Status& s) { return to_grpc_status(s); }

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ServerImpl;

// What a group hears of a routed request that ended without finishing normally (refused,
// cancelled, the client gone): it counts as served, without tokens to learn from.
GenerationUpdate cancelled_update() {
  GenerationUpdate u;
  u.finish = FinishReason::kAborted;
  return u;
}

// Session is a callback method (session.h says why); the others are synchronous.
class Service final : public v1::Helios::WithCallbackMethod_Session<v1::Helios::Service> {
 public:
  explicit Service(ServerImpl& server) : server_(server) {}
  grpc::Status Generate(ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Abort(ServerContext* ctx, const v1::AbortRequest* req, v1::AbortResponse* resp) override;
  grpc::Status Tokenize(ServerContext* ctx, const v1::TokenizeRequest* req, v1::TokenizeResponse* resp) override;
  grpc::Status Detokenize(ServerContext* ctx, const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp) override;
  grpc::Status ListModels(ServerContext* ctx, const v1::ListModelsRequest* req, v1::ListModelsResponse* resp) override;
  grpc::Status GetModelInfo(ServerContext* ctx, const v1::GetModelInfoRequest* req, v1::ModelInfo* resp) override;
  grpc::Status GetServerStatus(ServerContext* ctx, const v1::GetServerStatusRequest* req, v1::ServerStatus* resp) override;
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(grpc::CallbackServerContext* ctx) override;

 private:
  grpc::Status open_session(const v1::SessionOpen& open, OpenedSession* session);
  ServerImpl& server_;
};

class ServerImpl final : public HeliosServer {
 public:
  ServerImpl(const HeliosConfig& config, MetricsRegistry& metrics)
      : config_(config), metrics_(metrics), service_(*this),
        rpc_errors_(metrics.counter("helios_rpc_errors_total", "RPCs that ended with an error")),
        serving_(metrics.gauge("helios_health_serving",
                               "1 while health is SERVING: loaded, not draining, no device fault, no stalled engine")),
        started_(Clock::now()) {}

  Status build() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (!config_.server.tls_cert_path.empty()) {
      HELIOS_ASSIGN_OR_RETURN(std::string cert, read_file(config_.server.tls_cert_path));
      HELIOS_ASSIGN_OR_RETURN(std::string key, read_file(config_.server.tls_key_path));
      grpc::SslServerCredentialsOptions ssl;
      ssl.pem_key_cert_pairs.push_back({key, cert});
      creds = grpc::SslServerCredentials(ssl);
    }
    builder.AddListeningPort(config_.server.listen, creds, &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      return unavailable("cannot listen on " + config_.server.listen +
                         " (address in use, or not HOST:PORT?)");
    }
    update_health();
    if (!config_.server.http_listen.empty()) {  // the OpenAI-compatible HTTP API (openai_http.h)
      HttpServerAccess access;
      access.find_target = [this](const std::string& name, grpc::Status* st) {
        const Target t = find_target(name, st);
        return HttpTarget{t.model, t.group};
      };
      access.models = [this] { return models(); };
      access.groups = [this] { return groups(); };
      access.state = [this] {
        std::shared_lock lock(mu_);
        if (faulted_) return std::string("faulted");
        if (state_ == ServerState::kServing) return std::string(stalled_ ? "stalled" : "serving");
        return std::string(state_ == ServerState::kLoading ? "loading" : "draining");
      };
      access.claim_request_id = [this](const std::string& id) { return claim_request_id(id); };
      access.release_request_id = [this](const std::string& id) { release_request_id(id); };
      access.count_error = [this] { count_error(); };
      HELIOS_ASSIGN_OR_RETURN(http_, OpenAiHttpServer::start(config_, metrics_, std::move(access)));
    }
    return ok_status();
  }

  int port() const override { return port_; }
  int http_port() const override { return http_ ? http_->port() : 0; }

  void set_models(std::vector<std::unique_ptr<ServedModel>> models,
                  std::vector<std::unique_ptr<ModelGroup>> groups) override {
    {
      std::unique_lock lock(mu_);
      models_ = std::move(models);
      groups_ = std::move(groups);
      state_ = ServerState::kServing;
    }
    update_health();  // a model that faulted while the others loaded keeps it NOT_SERVING
    if (config_.server.liveness_timeout_s > 0) {
      watchdog_ = std::make_unique<LivenessWatchdog>(
          config_.server.liveness_timeout_s, metrics_, [this] { return engine_samples(); },
          [this](bool any_stalled) {
            {
              std::unique_lock lock(mu_);
              stalled_ = any_stalled;
            }
            update_health();
          });
    }
  }

  void report_fault(const std::string& model, const std::string& error) override {
    spdlog::error("{}: device fault, the model takes no more requests: {}", model, error);
    {
      std::unique_lock lock(mu_);
      faulted_ = true;
    }
    update_health();
  }

  void drain_and_stop(double drain_timeout_s) override {
    {
      std::unique_lock lock(mu_);
      if (state_ == ServerState::kDraining) return;
      state_ = ServerState::kDraining;
    }
    update_health();
    spdlog::info("draining: waiting up to {:.1f} s for {} in-flight requests", drain_timeout_s, n_live());
    const auto deadline = Clock::now() + std::chrono::duration<double>(drain_timeout_s);
    while (n_live() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (n_live() > 0) {
      spdlog::warn("drain timeout: ending {} requests", n_live());
      for (auto& m : models_) m->engine->abort_all("the server shut down before this request finished");
      for (auto& g : groups_) g->abort_all("the server shut down before this request finished");
    }
    if (http_) http_->stop();  // its streams' last chunks written, then no more connections
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
    watchdog_.reset();  // before the engines it samples go
    std::unique_lock lock(mu_);
    models_.clear();  // stops the engines
    groups_.clear();
  }

  // --- used by the handlers
  grpc::Status check_auth(const grpc::ServerContextBase* ctx) const {
    if (config_.server.api_keys.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    std::string key;
    if (auto it = md.find("authorization"); it != md.end()) {
      key = std::string(it->second.data(), it->second.size());
      if (key.rfind("Bearer ", 0) == 0) key = key.substr(7);
    } else if (auto it2 = md.find("x-api-key"); it2 != md.end()) {
      key = std::string(it2->second.data(), it2->second.size());
    }
    for (const auto& valid : config_.server.api_keys) {
      if (!key.empty() && key == valid) return grpc::Status::OK;
    }
    return {StatusCode::UNAUTHENTICATED,
            key.empty() ? "this server needs an API key: send 'authorization: Bearer <key>'"
                        : "the API key is not valid"};
  }

  // What a request names: a model, or a group ("" = the first model, else the first group).
  struct Target {
    ServedModel* model = nullptr;
    ModelGroup* group = nullptr;
  };
  // Null in both with the error in *status.
  Target find_target(const std::string& name, grpc::Status* status) const {
    std::shared_lock lock(mu_);
    if (state_ != ServerState::kServing) {
      *status = {StatusCode::UNAVAILABLE, state_ == ServerState::kLoading ? "the server is loading its models"
                                                                          : "the server is shutting down"};
      return {};
    }
    if (name.empty()) return models_.empty() ? Target{nullptr, groups_.front().get()} : Target{models_.front().get()};
    for (const auto& m : models_) {
      if (m->entry.name == name) return {m.get()};
    }
    for (const auto& g : groups_) {
      if (g->name() == name) return {nullptr, g.get()};
    }
    std::string names;
    for (const auto& m : models_) names += (names.empty() ? "" : ", ") + m->entry.name;
    for (const auto& g : groups_) names += (names.empty() ? "" : ", ") + g->name() + " (group)";
    *status = {StatusCode::NOT_FOUND, "unknown model '" + name + "' (served: " + names + ")"};
    return {};
  }

  // A model for Tokenize, Detokenize and model info: a group answers with its current engine.
  std::shared_ptr<ServedModel> find_model(const std::string& name, grpc::Status* status) const {
    const Target t = find_target(name, status);
    if (t.group) return t.group->current();
    return t.model ? std::shared_ptr<ServedModel>(std::shared_ptr<ServedModel>(), t.model) : nullptr;
  }

  std::vector<ModelGroup*> groups() const {
    std::shared_lock lock(mu_);
    std::vector<ModelGroup*> out;
    for (const auto& g : groups_) out.push_back(g.get());
    return out;
  }

  std::vector<ServedModel*> models() const {
    std::shared_lock lock(mu_);
    std::vector<ServedModel*> out;
    for (const auto& m : models_) out.push_back(m.get());
    return out;
  }

  ServerState state() const {
    std::shared_lock lock(mu_);
    return state_;
  }
  size_t n_live() const {
    size_t n = 0;
    for (ServedModel* m : models()) n += m->engine->n_live();
    for (ModelGroup* g : groups()) n += g->n_live();
    return n;
  }
  std::string next_request_id() { return "req-" + std::to_string(++request_counter_); }

  // Request ids are unique across the server's models while the request lives (Abort finds it by
  // id alone). False when the id is taken.
  bool claim_request_id(const std::string& id) {
    std::lock_guard<std::mutex> lock(ids_mu_);
    return live_ids_.insert(id).second;
  }
  void release_request_id(const std::string& id) {
    std::lock_guard<std::mutex> lock(ids_mu_);
    live_ids_.erase(id);
  }
  const HeliosConfig& config() const { return config_; }
  double uptime() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  void count_error() { rpc_errors_->inc(); }

 private:
  // Health from the state as it is now. Serialised, so that of two threads changing the state the
  // later write is always the truth (a watchdog's SERVING cannot land after a drain's NOT_SERVING).
  void update_health() {
    std::lock_guard<std::mutex> health_lock(health_mu_);
    bool serving = false;
    {
      std::shared_lock lock(mu_);
      serving = state_ == ServerState::kServing && !faulted_ && !stalled_;
    }
    if (auto* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(serving);
      health->SetServingStatus(kServiceName, serving);
    }
    serving_->set(serving ? 1 : 0);
  }

  // What the watchdog samples: every model's engine and every loaded engine of each group.
  std::vector<EngineSample> engine_samples() const {
    std::vector<EngineSample> out;
    for (ServedModel* m : models()) out.push_back({m->entry.name, m->engine->progress()});
    for (ModelGroup* g : groups()) {
      auto engines = g->engine_progress();
      if (!engines) {
        out.push_back({g->name() + "/", std::nullopt});
        continue;
      }
      for (auto& [name, progress] : *engines) out.push_back({std::move(name), progress});
    }
    return out;
  }

  HeliosConfig config_;
  MetricsRegistry& metrics_;
  Service service_;
  Counter* rpc_errors_;
  Gauge* serving_;
  Clock::time_point started_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::shared_mutex mu_;
  ServerState state_ = ServerState::kLoading;
  bool faulted_ = false;  // a device error: NOT_SERVING from then on
  bool stalled_ = false;  // an engine with work completes no step (the watchdog): NOT_SERVING meanwhile
  std::mutex health_mu_;
  std::vector<std::unique_ptr<ServedModel>> models_;
  std::vector<std::unique_ptr<ModelGroup>> groups_;
  std::atomic<uint64_t> request_counter_{0};
  std::mutex ids_mu_;
  std::unordered_set<std::string> live_ids_;
  std::unique_ptr<OpenAiHttpServer> http_;  // stopped before the models it serves go
  std::unique_ptr<LivenessWatchdog> watchdog_;  // while serving; last, so it stops before the models go
};

// Holds a request id for the life of one Generate call.
class RequestIdClaim {
 public:
  RequestIdClaim(ServerImpl& server, std::string id) : server_(server), id_(std::move(id)) {
    claimed_ = server_.claim_request_id(id_);
  }
  ~RequestIdClaim() {
    if (claimed_) server_.release_request_id(id_);
  }
  bool claimed() const { return claimed_; }

 private:
  ServerImpl& server_;
  std::string id_;
  bool claimed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Handlers

grpc::Status Service::Generate(ServerContext* ctx, const v1::GenerateRequest* req,
                               grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  grpc::Status status;
  const auto target = server_.find_target(req->model(), &status);
  if (!target.model && !target.group) return status;
  // A group's manager picks the engine (and with it the model, depth and exit rule).
  std::optional<GroupRoute> route;
  if (target.group) {
    auto routed = target.group->route();
    if (!routed.ok()) return to_grpc(routed.status());
    route = std::move(*routed);
  }
  ServedModel* m = route ? route->served.get() : target.model;
  // Refuse before tokenizing: an overloaded server should not spend time on work it will drop.
  if (!m->engine->has_capacity()) {
    server_.count_error();
    return {StatusCode::RESOURCE_EXHAUSTED, "the request queue is full; retry later"};
  }
  RequestLimits limits{server_.config().limits, m->context_tokens, m->entry.early_exit};
  auto request = to_generation_request(*req, *m->model, limits);
  if (!request.ok()) {
    if (route) target.group->on_update(*route, cancelled_update());
    return to_grpc(request.status());
  }
  if (route) {
    request->exit = route->exit;
    request->observe_exits = route->observe;
  }
  const std::string id = req->request_id().empty() ? server_.next_request_id() : req->request_id();
  const RequestIdClaim claim(server_, id);
  if (!claim.claimed()) {
    if (route) target.group->on_update(*route, cancelled_update());
    return {StatusCode::ALREADY_EXISTS, "request id '" + id + "' is already in use"};
  }
  request->client_id = id;
  auto stream = m->engine->submit(std::move(*request));
  if (!stream.ok()) {
    server_.count_error();
    if (route) target.group->on_update(*route, cancelled_update());
    return to_grpc(stream.status());
  }
  const std::string model_name = route ? route->served->entry.name : m->entry.name;
  int32_t loaded_depth = m->engine->status().loaded_layers;  // each token says its own (an extension)
  spdlog::debug("{}: queued on {} ({} layers)", id, model_name, loaded_depth);
  for (;;) {
    auto update = (*stream)->pop(std::chrono::milliseconds(20));
    if (ctx->IsCancelled()) {
      m->engine->abort(id);
      if (route) target.group->on_update(*route, cancelled_update());
      spdlog::info("{}: cancelled by the client", id);
      return {StatusCode::CANCELLED, "cancelled"};
    }
    if (!update) continue;
    if (route) target.group->on_update(*route, *update);
    if (!update->tokens.empty()) loaded_depth = update->tokens.back().loaded_layers;
    const bool server_ended = update->finish == FinishReason::kAborted && !update->error.empty();
    v1::GenerateResponse response;
    to_response(*update, id, &response);
    for (int i = 0; i < response.tokens_size(); ++i) {
      response.mutable_tokens(i)->set_model(model_name);
      response.mutable_tokens(i)->set_loaded_depth(update->tokens[i].loaded_layers);
    }
    if (server_ended) response.set_finish_reason(v1::FINISH_REASON_UNSPECIFIED);
    if ((!server_ended || response.tokens_size() > 0) && !writer->Write(response)) {
      m->engine->abort(id);
      if (route && update->finish == FinishReason::kNone) target.group->on_update(*route, cancelled_update());
      return {StatusCode::CANCELLED, "the client went away"};
    }
    if (server_ended) {
      server_.count_error();
      spdlog::warn("{}: ended by the server: {}", id, update->error);
      return to_grpc(helios::Status(update->error_code, update->error));
    }
    if (update->finish != FinishReason::kNone) {
      spdlog::info("{}: {} prompt + {} generated tokens on {} ({} layers), ttft {:.3f} s, total {:.3f} s", id,
                   update->prompt_tokens, update->completion_tokens, model_name, loaded_depth, update->ttft_seconds,
                   update->total_seconds);
      return grpc::Status::OK;
    }
  }
}

grpc::Status Service::Abort(ServerContext* ctx, const v1::AbortRequest* req, v1::AbortResponse* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  if (req->request_id().empty()) return {StatusCode::INVALID_ARGUMENT, "request_id is empty"};
  bool found = false;
  for (ServedModel* m : server_.models()) found = m->engine->abort(req->request_id()) || found;
  for (ModelGroup* g : server_.groups()) found = g->abort(req->request_id()) || found;
  resp->set_found(found);
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Service::Session(grpc::CallbackServerContext* ctx) {
  return start_session(ctx, server_.check_auth(ctx), server_.config().intercepts.paused_idle_timeout_s,
                       [this](const v1::SessionOpen& open, OpenedSession* s) { return open_session(open, s); });
}

// A session's open, as Generate opens a request: the target, a group's route, capacity, the
// conversion (session.cpp adds the intercepts), the request id and submit.
grpc::Status Service::open_session(const v1::SessionOpen& open, OpenedSession* s) {
  const v1::GenerateRequest& req = open.request();
  grpc::Status status;
  const auto target = server_.find_target(req.model(), &status);
  if (!target.model && !target.group) return status;
  if (target.group) {
    auto routed = target.group->route();
    if (!routed.ok()) return to_grpc(routed.status());
    s->group = target.group;
    s->route = std::move(*routed);
  }
  ServedModel* m = s->route ? s->route->served.get() : target.model;
  auto refuse = [&](const grpc::Status& st) {
    if (s->route) target.group->on_update(*s->route, cancelled_update());
    return st;
  };
  if (!m->engine->has_capacity()) {
    server_.count_error();
    return refuse({StatusCode::RESOURCE_EXHAUSTED, "the request queue is full; retry later"});
  }
  s->limits = RequestLimits{server_.config().limits, m->context_tokens, m->entry.early_exit};
  auto prepared = prepare_session(open, *m->model, s->limits);
  if (!prepared.ok()) return refuse(to_grpc(prepared.status()));
  GenerationRequest& request = prepared->request;
  if (s->route) {
    request.exit = s->route->exit;
    request.observe_exits = s->route->observe;
  }
  const std::string id = req.request_id().empty() ? server_.next_request_id() : req.request_id();
  auto claim = std::make_shared<RequestIdClaim>(server_, id);
  if (!claim->claimed()) return refuse({StatusCode::ALREADY_EXISTS, "request id '" + id + "' is already in use"});
  request.client_id = id;
  s->open_max_tokens = req.max_tokens();
  s->prompt_tokens = static_cast<int32_t>(request.prompt.size());
  auto stream = m->engine->submit(std::move(request));
  if (!stream.ok()) {
    server_.count_error();
    return refuse(to_grpc(stream.status()));
  }
  s->id = id;
  s->served = m;
  s->model_name = m->entry.name;
  s->stream = std::move(*stream);
  s->turns = std::move(prepared->turns);
  s->hold = std::move(claim);
  s->count_error = [this] { server_.count_error(); };
  spdlog::debug("{}: session opened on {}", id, s->model_name);
  return grpc::Status::OK;
}

grpc::Status Service::Tokenize(ServerContext* ctx, const v1::TokenizeRequest* req, v1::TokenizeResponse* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  grpc::Status status;
  const std::shared_ptr<ServedModel> m = server_.find_model(req->model(), &status);
  if (!m) return status;
  const Tokenizer& tok = m->model->tokenizer();
  for (TokenId id : tok.encode(req->text(), req->add_special(), req->parse_special())) {
    resp->add_token_ids(id);
    // A piece can be part of a UTF-8 character (byte tokens, byte-level BPE); proto3 strings must
    // be valid UTF-8 or clients fail to parse the whole response, so the broken bytes become U+FFFD.
    resp->add_pieces(valid_utf8(tok.token_to_piece(id, true)));
  }
  return grpc::Status::OK;
}

grpc::Status Service::Detokenize(ServerContext* ctx, const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  grpc::Status status;
  const std::shared_ptr<ServedModel> m = server_.find_model(req->model(), &status);
  if (!m) return status;
  std::vector<TokenId> ids(req->token_ids().begin(), req->token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= m->model->config().n_vocab) {
      return {StatusCode::INVALID_ARGUMENT, "token_ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                                " is outside the vocabulary"};
    }
  }
  resp->set_text(valid_utf8(m->model->tokenizer().decode(ids)));  // ids may split a character
  return grpc::Status::OK;
}

void fill_model_info(const ServedModel& m, v1::ModelInfo* info) {
  const ModelConfig& c = m.model->config();
  info->set_name(m.entry.name);
  info->set_path(m.entry.path);
  info->set_architecture(c.architecture);
  info->set_n_layers(c.n_layer);
  info->set_n_embd(c.n_embd);
  info->set_n_heads(c.n_head);
  info->set_n_kv_heads(c.n_head_kv);
  info->set_n_vocab(c.n_vocab);
  info->set_context_length(m.context_tokens);
  // Depth, exits and parameters from the engine's snapshot: a group's engine may be extended.
  const EngineStatus st = m.engine->status();
  info->set_n_parameters(st.n_params);
  info->set_loaded_layers(st.loaded_layers);
  info->set_backend(m.model->backend().name());
  const EarlyExitConfig& ee = m.entry.early_exit;
  for (int32_t layer : st.exit_layers) info->add_exit_layers(layer);
  to_exit_options(m.default_exit, info->mutable_default_exit());
  info->set_exit_heads_path(ee.heads_path);
  info->set_exit_override_allowed(ee.allow_request_override);
  for (ExitPolicy p : ee.allowed_policies) info->add_allowed_exit_policies(exit_policy_name(p));
  info->set_min_exit_threshold(ee.min_threshold);
}

void fill_early_exit_stats(const ServedModel& m, const EngineStatus& e, v1::EarlyExitStats* out) {
  out->set_default_policy(exit_policy_name(m.default_exit.policy));
  for (int32_t layer : e.exit_layers) out->add_exit_layers(layer);
  int64_t n_tokens = 0, layer_sum = 0;
  for (size_t layer = 0; layer < e.exit_layer_counts.size(); ++layer) {
    out->add_exit_layer_counts(e.exit_layer_counts[layer]);
    n_tokens += e.exit_layer_counts[layer];
    layer_sum += e.exit_layer_counts[layer] * static_cast<int64_t>(layer);
  }
  out->set_mean_exit_layer(n_tokens > 0 ? static_cast<double>(layer_sum) / n_tokens : 0.0);
  out->set_layers_computed_total(e.layers_computed_total);
  out->set_layers_per_token(e.generated_tokens_total > 0
                                ? static_cast<double>(e.layers_computed_total) / e.generated_tokens_total
                                : 0.0);
  out->set_kv_fill_layers_total(e.kv_fill_layers_total);
  out->set_draft_tokens_total(e.draft_tokens_total);
  out->set_draft_tokens_accepted(e.draft_tokens_accepted);
  out->set_draft_acceptance_rate(e.draft_tokens_total > 0
                                     ? static_cast<double>(e.draft_tokens_accepted) / e.draft_tokens_total
                                     : 0.0);
}

void fill_group_status(const GroupStatusSnapshot& gs, v1::GroupStatus* out) {
  out->set_name(gs.name);
  out->set_slo(slo_mode_name(gs.params.slo));
  out->set_phase(gs.evaluating ? "evaluating" : "serving");
  out->set_model(gs.model);
  out->set_loaded_depth(gs.depth);
  out->set_n_layers(gs.n_layers);
  for (const std::string& c : gs.candidates) out->add_candidates(c);
  for (const PhtRow& r : gs.pht) {
    v1::PhtRow* row = out->add_performance_history();
    row->set_model(r.model);
    row->set_depth(r.depth);
    row->set_requests(r.requests);
    row->set_tokens(r.tokens);
    row->set_throughput_tok_s(r.throughput_tok_s());
    row->set_mean_ttft_seconds(r.mean_ttft_s());
    row->set_mean_tpot_seconds(r.mean_tpot_s());
    row->set_perplexity(r.perplexity());
    row->set_joules_per_token(r.tokens > 0 ? r.joules_per_token() : 0.0);
    row->set_observed_tokens(r.observed_tokens);
    for (int32_t e : r.exits) {
      row->add_exit_layers(e);
      row->add_leave_share(r.leave_share(e));
    }
  }
  out->set_confidence_breaches(gs.breaches);
  out->set_cbc_window(gs.params.cbc_window);
  out->set_cbc_max(gs.params.cbc_max);
  out->set_threshold(gs.params.threshold);
  out->set_requests_total(gs.requests_total);
  out->set_requests_since_evaluation(gs.requests_since_evaluation);
  out->set_reassess_every(gs.params.reassess_every);
  v1::MemorySplit* mem = out->mutable_memory();
  mem->set_budget_bytes(gs.memory.budget_bytes);
  mem->set_weight_bytes(gs.memory.weight_bytes);
  mem->set_kv_bytes(gs.memory.kv_bytes);
  mem->set_kv_blocks(gs.memory.kv_blocks);
  mem->set_kv_block_size(gs.memory.kv_block_size);
  mem->set_max_batch(gs.memory.max_batch);
  mem->set_batch_context(gs.memory.batch_context);
  for (const DecisionRecord& d : gs.decisions) {
    v1::ManagerDecision* md = out->add_decisions();
    md->set_decision(decision_kind_name(d.decision.kind));
    md->set_model(d.model);
    md->set_loaded_depth(d.decision.target.depth);
    md->set_reason(d.decision.reason);
    md->set_at_seconds(d.at_seconds);
  }
  for (const LoadedEngineStatus& le : gs.engines) {
    v1::LoadedEngine* e = out->add_engines();
    e->set_model(le.model);
    e->set_loaded_depth(le.depth);
    e->set_running(le.engine.running);
    e->set_waiting(le.engine.waiting);
    e->set_kv_blocks_total(le.engine.kv_blocks_total);
    e->set_kv_blocks_used(le.engine.kv_blocks_used);
    e->set_weight_bytes(le.weight_bytes);
    e->set_generated_tokens_total(le.engine.generated_tokens_total);
  }
}

grpc::Status Service::ListModels(ServerContext* ctx, const v1::ListModelsRequest*, v1::ListModelsResponse* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  for (ServedModel* m : server_.models()) fill_model_info(*m, resp->add_models());
  for (ModelGroup* g : server_.groups()) {  // a group, described by the engine it serves from now
    if (const auto m = g->current()) {
      v1::ModelInfo* info = resp->add_models();
      fill_model_info(*m, info);
      info->set_name(g->name());
    }
  }
  return grpc::Status::OK;
}

grpc::Status Service::GetModelInfo(ServerContext* ctx, const v1::GetModelInfoRequest* req, v1::ModelInfo* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  grpc::Status status;
  const std::shared_ptr<ServedModel> m = server_.find_model(req->model(), &status);
  if (!m) return status;
  fill_model_info(*m, resp);
  return grpc::Status::OK;
}

void fill_intercept_status(const std::string& model, const InterceptStats& st, v1::InterceptStatus* out) {
  out->set_model(model);
  out->set_default_hold(hold_policy_name(st.default_hold));
  out->set_paused(st.paused);
  out->set_paused_kv_bytes(st.paused_kv_bytes);
  out->set_swapped_kv_bytes(st.swapped_kv_bytes);
  out->set_intercepts_total(st.intercepts_total);
  for (const auto& [key, count] : st.decisions) {
    v1::HoldDecisionCount* d = out->add_decisions();
    d->set_policy(key.first);
    d->set_decision(key.second);
    d->set_count(count);
  }
  out->set_waste_preserve_byte_seconds(st.waste_preserve);
  out->set_waste_recompute_byte_seconds(st.waste_recompute);
  out->set_waste_swap_byte_seconds(st.waste_swap);
  out->set_kv_byte_seconds(st.kv_byte_seconds);
  out->set_forward_seconds(st.forward_seconds);
  out->set_recompute_seconds(st.recompute_seconds);
  out->set_saturation_tokens(st.saturation_tokens);
  out->set_copy_bytes_per_second(st.copy_bytes_per_second);
  for (const auto& [tokens, seconds] : st.forward_profile) {
    v1::ProfilePoint* p = out->add_forward_profile();
    p->set_tokens(tokens);
    p->set_seconds(seconds);
  }
}

// The server's totals: every engine's queues, KV and counters added up.
void add_engine_totals(const EngineStatus& e, v1::ServerStatus* resp) {
  resp->set_requests_waiting(resp->requests_waiting() + e.waiting);
  resp->set_requests_running(resp->requests_running() + e.running);
  resp->set_requests_swapped(resp->requests_swapped() + e.swapped);
  resp->set_kv_blocks_total(resp->kv_blocks_total() + e.kv_blocks_total);
  resp->set_kv_blocks_used(resp->kv_blocks_used() + e.kv_blocks_used);
  resp->set_kv_block_size(e.kv_block_size);
  resp->set_batch_size(resp->batch_size() + e.batch_size);
  resp->set_batch_tokens(resp->batch_tokens() + e.batch_tokens);
  resp->set_steps_per_second(std::max(resp->steps_per_second(), e.steps_per_second));
  resp->set_preemptions(resp->preemptions() + e.preemptions);
  resp->set_requests_total(resp->requests_total() + e.requests_total);
  resp->set_generated_tokens_total(resp->generated_tokens_total() + e.generated_tokens_total);
}

void fill_prefix_cache_status(const PrefixCacheStats& c, v1::PrefixCacheStatus* out) {
  out->set_enabled(c.enabled);
  out->set_cached_blocks(c.cached_blocks);
  out->set_query_tokens(c.query_tokens);
  out->set_hit_tokens(c.hit_tokens);
  out->set_hit_rate(c.query_tokens > 0 ? static_cast<double>(c.hit_tokens) / c.query_tokens : 0.0);
  out->set_query_blocks(c.query_blocks);
  out->set_hit_blocks(c.hit_blocks);
  out->set_evictions(c.evictions);
}

grpc::Status Service::GetServerStatus(ServerContext* ctx, const v1::GetServerStatusRequest*, v1::ServerStatus* resp) {
  if (grpc::Status s = server_.check_auth(ctx); !s.ok()) return s;
  const ServerState state = server_.state();
  resp->set_state(state == ServerState::kLoading ? "LOADING" : state == ServerState::kServing ? "SERVING" : "DRAINING");
  for (ServedModel* m : server_.models()) {
    const EngineStatus e = m->engine->status();
    add_engine_totals(e, resp);
    v1::ModelStatus* model = resp->add_models();
    model->set_name(m->entry.name);
    model->set_requests_total(e.requests_total);
    model->set_generated_tokens_total(e.generated_tokens_total);
    fill_early_exit_stats(*m, e, model->mutable_early_exit());
    fill_prefix_cache_status(e.prefix_cache, model->mutable_prefix_cache());
    fill_intercept_status(m->entry.name, e.intercepts, resp->add_intercepts());
  }
  for (ModelGroup* g : server_.groups()) {
    const GroupStatusSnapshot gs = g->status();
    for (const LoadedEngineStatus& le : gs.engines) {
      add_engine_totals(le.engine, resp);
      fill_intercept_status(le.model, le.engine.intercepts, resp->add_intercepts());  // a group's engines too
    }
    fill_group_status(gs, resp->add_groups());
  }
  resp->set_uptime_seconds(server_.uptime());
  return grpc::Status::OK;
}

}  // namespace

StatusOr<std::unique_ptr<HeliosServer>> HeliosServer::start(const HeliosConfig& config,
                                                           MetricsRegistry& metrics) {
  auto server = std::make_unique<ServerImpl>(config, metrics);
  HELIOS_RETURN_IF_ERROR(server->build());
  return std::unique_ptr<HeliosServer>(std::move(server));
}

}  // namespace helios::server
