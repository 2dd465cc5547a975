// HTTP handlers of the OpenAI-compatible API: check the key, parse, find the model, submit one
// engine request per choice, then stream (server-sent events, one chunked-response provider call
// for the whole stream) or wait and answer once. The JSON is openai_convert's.
#include "server/openai_http.h"

#include <httplib.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "server/openai_convert.h"
#include "server/request_convert.h"

namespace helios::server {
namespace {

using openai::ApiError;
using openai::Json;
using Clock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// A stream that has said nothing for this long sends an SSE comment: clients ignore it, and a
// client that has gone away is found by the failed write (its request is then aborted).
constexpr auto kKeepAliveInterval = std::chrono::milliseconds(1000);

ApiError grpc_error(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return openai::error_from_status(StatusCode::kNotFound, s.error_message());
    case grpc::StatusCode::UNAVAILABLE: return openai::error_from_status(StatusCode::kUnavailable, s.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return openai::error_from_status(StatusCode::kResourceExhausted, s.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT:
      return openai::error_from_status(StatusCode::kInvalidArgument, s.error_message());
    default: return openai::error_from_status(StatusCode::kInternal, s.error_message());
  }
}

// The request's key, as the gRPC API takes it: "Authorization: Bearer KEY" or "x-api-key: KEY".
std::optional<ApiError> check_key(const std::vector<std::string>& keys, const httplib::Request& req) {
  if (keys.empty()) return std::nullopt;
  std::string key;
  if (req.has_header("Authorization")) {
    key = req.get_header_value("Authorization");
    if (key.rfind("Bearer ", 0) == 0) key = key.substr(7);
  } else if (req.has_header("x-api-key")) {
    key = req.get_header_value("x-api-key");
  }
  for (const auto& valid : keys) {
    if (!key.empty() && key == valid) return std::nullopt;
  }
  ApiError e;
  e.http_status = 401;
  e.code = "invalid_api_key";
  e.message = key.empty() ? "this server needs an API key: send 'Authorization: Bearer <key>'"
                          : "the API key is not valid";
  return e;
}

// A draining or loading server's error says which, in `code`.
ApiError with_state_code(ApiError e, const std::string& state) {
  if (e.http_status == 503) e.code = state == "serving" || state == "stalled" ? "unavailable" : state;
  return e;
}

}  // namespace

class HttpJob;

// One choice: one engine request.
struct HttpChoice {
  int32_t index = 0, prompt_index = 0;
  std::string id;
  ServedModel* served = nullptr;
  std::optional<GroupRoute> route;
  std::shared_ptr<RequestStream> stream;
  bool claimed = false;
  bool done = false;
  openai::ChoiceOutput out;     // accumulated (non-streaming)
  openai::ToolCallParser tools;
  int64_t text_offset = 0;
  int32_t prompt_tokens = 0, completion_tokens = 0;
  double ttft_s = 0, total_s = 0;
  FinishReason finish = FinishReason::kNone;
};

struct OpenAiHttpServer::Impl {
  HeliosConfig config;
  MetricsRegistry& metrics;
  HttpServerAccess access;
  std::unique_ptr<httplib::Server> http;
  std::thread listener;
  int port = 0;
  int64_t started_unix = 0;
  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::set<HttpJob*> jobs;

  Impl(const HeliosConfig& c, MetricsRegistry& m, HttpServerAccess a)
      : config(c), metrics(m), access(std::move(a)), started_unix(std::time(nullptr)) {}

  void count(const std::string& endpoint, int status) {
    metrics.counter("helios_http_requests_total", "OpenAI API HTTP requests by endpoint and status",
                    {{"endpoint", endpoint}, {"code", std::to_string(status)}})
        ->inc();
  }
  void reply_error(httplib::Response& res, const ApiError& e, const std::string& endpoint) {
    if (e.http_status >= 500 || e.http_status == 429) access.count_error();
    res.status = e.http_status;
    res.set_content(openai::dump(e.to_json()), "application/json");
    count(endpoint, e.http_status);
  }
  void reply_json(httplib::Response& res, const Json& j, const std::string& endpoint) {
    res.status = 200;
    res.set_content(openai::dump(j), "application/json");
    count(endpoint, 200);
  }

  void handle_models(const httplib::Request& req, httplib::Response& res);
  void handle_generate(const httplib::Request& req, httplib::Response& res, openai::Endpoint endpoint);
};

// One HTTP generation request: its choices, from submit to the last update. Registered with the
// server while it lives, so that stop() can wait for it (and end it).
class HttpJob {
 public:
  HttpJob(OpenAiHttpServer::Impl& server, openai::Request request)
      : server_(server), request_(std::move(request)),
        id_(openai::random_id(request_.endpoint == openai::Endpoint::kChat ? "chatcmpl-" : "cmpl-")) {
    std::lock_guard lock(server_.jobs_mu);
    server_.jobs.insert(this);
  }
  ~HttpJob() {
    abort_unfinished();
    for (HttpChoice& c : choices_) {
      if (c.claimed) server_.access.release_request_id(c.id);
    }
    std::lock_guard lock(server_.jobs_mu);
    server_.jobs.erase(this);
    server_.jobs_cv.notify_all();
  }

  const std::string& id() const { return id_; }
  const openai::Request& request() const { return request_; }
  const std::string& model_name() const { return model_name_; }
  std::vector<HttpChoice>& choices() { return choices_; }
  const Tokenizer& tokenizer() const { return choices_.front().served->model->tokenizer(); }

  // Routes, checks and submits every choice. On an error none is left running.
  std::optional<ApiError> submit() {
    grpc::Status status;
    const HttpTarget target = server_.access.find_target(request_.model, &status);
    if (!target.model && !target.group) return with_state_code(grpc_error(status), server_.access.state());
    group_ = target.group;
    model_name_ = target.group ? target.group->name() : target.model->entry.name;
    const int32_t n_choices = request_.n_choices();
    choices_.reserve(n_choices);
    for (int32_t p = 0; p < static_cast<int32_t>(request_.prompts.size()); ++p) {
      for (int32_t j = 0; j < request_.n; ++j) {
        HttpChoice& c = choices_.emplace_back();
        c.index = p * request_.n + j;
        c.prompt_index = p;
        c.out.index = c.index;
        c.tools = openai::ToolCallParser(request_.tool_names);
        if (auto e = submit_one(target, c, j)) {
          if (c.route) group_->on_update(*c.route, cancelled());
          if (c.claimed) server_.access.release_request_id(c.id);
          choices_.pop_back();
          abort_unfinished();
          if (e->http_status == 400 && request_.prompts.size() > 1) e->message = "prompt[" + std::to_string(p) + "]: " + e->message;
          return e;
        }
      }
    }
    return std::nullopt;
  }

  // Waits up to `timeout` for updates of the unfinished choices; (choice, update) pairs.
  std::vector<std::pair<HttpChoice*, GenerationUpdate>> poll(std::chrono::milliseconds timeout) {
    std::vector<std::pair<HttpChoice*, GenerationUpdate>> out;
    size_t open = 0;
    for (const HttpChoice& c : choices_) open += !c.done;
    const auto each = open > 1 ? std::chrono::milliseconds(std::max<int64_t>(1, timeout.count() / open)) : timeout;
    for (HttpChoice& c : choices_) {
      if (c.done) continue;
      auto update = c.stream->pop(out.empty() ? each : std::chrono::milliseconds(0));
      if (!update) continue;
      if (c.route) group_->on_update(*c.route, *update);
      if (update->finish != FinishReason::kNone) {
        c.done = true;
        c.finish = update->finish;
        c.prompt_tokens = update->prompt_tokens;
        c.completion_tokens = update->completion_tokens;
        c.ttft_s = update->ttft_seconds;
        c.total_s = update->total_seconds;
      }
      out.emplace_back(&c, std::move(*update));
    }
    return out;
  }

  bool all_done() const {
    for (const HttpChoice& c : choices_) {
      if (!c.done) return false;
    }
    return true;
  }

  // An update that ends the request with an error: the server ended it (shutdown, a device
  // error, a request that can never fit the KV cache) or someone aborted it by id.
  static std::optional<ApiError> update_error(const GenerationUpdate& u) {
    if (u.finish != FinishReason::kAborted) return std::nullopt;
    if (u.error.empty()) {
      ApiError e = openai::error_from_status(StatusCode::kUnavailable, "the request was aborted (Abort)");
      e.code = "aborted";
      return e;
    }
    // RESOURCE_EXHAUSTED here means it can never fit, whatever the load: not a 429 to retry.
    if (u.error_code == StatusCode::kResourceExhausted) return openai::invalid_request("", u.error);
    return openai::error_from_status(u.error_code, u.error);
  }

  // Ends every unfinished choice in its engine (the client went away, an error, the drain). The
  // KV blocks are freed by the engine's next step.
  void abort_unfinished(const std::string& server_reason = "") {
    std::lock_guard lock(mu_);
    for (HttpChoice& c : choices_) {
      if (!c.stream || c.done) continue;
      c.served->engine->abort(c.id, server_reason);
      if (c.route) group_->on_update(*c.route, cancelled());
      c.done = true;
      c.finish = FinishReason::kAborted;
    }
  }
  // From stop(), on another thread: asks the engines to end the request; the handler thread
  // then sees the ending update and answers with it.
  void end_from_server(const std::string& reason) {
    std::lock_guard lock(mu_);
    for (const auto& [engine, id] : submitted_) engine->abort(id, reason);
  }

  void log_done() const {
    int64_t prompt = 0, generated = 0;
    for (const HttpChoice& c : choices_) {
      prompt += (c.index % request_.n == 0) ? c.prompt_tokens : 0;
      generated += c.completion_tokens;
    }
    const HttpChoice& first = choices_.front();
    spdlog::info("{}: {} prompt + {} generated tokens on {} ({} choice{}), ttft {:.3f} s, total {:.3f} s (HTTP)", id_,
                 prompt, generated, model_name_, choices_.size(), choices_.size() == 1 ? "" : "s", first.ttft_s,
                 first.total_s);
  }

 private:
  static GenerationUpdate cancelled() {
    GenerationUpdate u;
    u.finish = FinishReason::kAborted;
    return u;
  }

  std::optional<ApiError> submit_one(const HttpTarget& target, HttpChoice& c, int32_t j) {
    if (target.group) {
      auto routed = target.group->route();
      if (!routed.ok()) return openai::error_from_status(routed.status().code(), routed.status().message());
      c.route = std::move(*routed);
    }
    ServedModel* m = c.route ? c.route->served.get() : target.model;
    c.served = m;
    c.out.model = m->entry.name;
    // Refused before tokenizing, as gRPC does: an overloaded server should not spend time on it.
    if (!m->engine->has_capacity()) {
      return openai::error_from_status(StatusCode::kResourceExhausted, "the request queue is full; retry later");
    }
    const RequestLimits limits{server_.config.limits, m->context_tokens, m->entry.early_exit};
    v1::GenerateRequest g = request_.prompts[c.prompt_index];
    g.mutable_sampling()->set_seed(g.sampling().seed() + static_cast<uint64_t>(j));
    const std::string prefix = openai::forced_reply_prefix(request_, m->model->tokenizer().spec().chat_template);
    auto gen = to_generation_request(g, *m->model, limits, request_.tools_json, prefix);
    if (!gen.ok()) return openai::from_conversion_error(gen.status(), request_);
    if (!request_.forced_call_grammars.empty()) {  // the call goes on from the prefix as a valid one
      gen->json_grammars = request_.forced_call_grammars;
      gen->json_prefix = openai::forced_call_start(request_);
    }
    if (c.route) {
      gen->exit = c.route->exit;
      gen->observe_exits = c.route->observe;
    }
    c.id = request_.n_choices() == 1 ? id_ : id_ + "-" + std::to_string(c.index);
    if (!server_.access.claim_request_id(c.id)) {
      return openai::error_from_status(StatusCode::kAlreadyExists, "request id '" + c.id + "' is already in use");
    }
    c.claimed = true;
    gen->client_id = c.id;
    auto stream = m->engine->submit(std::move(*gen));
    if (!stream.ok()) return openai::error_from_status(stream.status().code(), stream.status().message());
    c.stream = std::move(*stream);
    c.tools.feed(prefix);  // the call's opening is the prompt's; the parser reads it with the reply
    std::lock_guard lock(mu_);
    submitted_.emplace_back(m->engine.get(), c.id);
    return std::nullopt;
  }

  OpenAiHttpServer::Impl& server_;
  openai::Request request_;
  std::string id_;
  std::string model_name_;
  ModelGroup* group_ = nullptr;
  std::vector<HttpChoice> choices_;
  std::mutex mu_;  // submitted_ (read by stop()) and the aborts
  std::vector<std::pair<Engine*, std::string>> submitted_;
};

namespace {

// What one update of a choice releases, as a delta: its text through the tool-call parser (chat
// with tools), its tokens, and at the end the finish reason (and the parsed calls).
openai::ChoiceOutput take_update(HttpJob& job, HttpChoice& c, const GenerationUpdate& u) {
  const openai::Request& r = job.request();
  openai::ChoiceOutput d;
  d.index = c.index;
  d.model = c.out.model;
  d.text_offset = c.text_offset;
  d.tokens = u.tokens;
  std::string text;
  for (const TokenEvent& t : u.tokens) text += t.text;
  c.text_offset += static_cast<int64_t>(text.size());
  d.text = r.parse_tool_calls ? c.tools.feed(text) : text;
  if (u.finish != FinishReason::kNone && u.finish != FinishReason::kAborted) {
    if (r.parse_tool_calls) {
      d.text += c.tools.finish();
      d.tool_calls = c.tools.calls();
    }
    d.finish_reason = openai::finish_reason_name(u.finish, !c.tools.calls().empty());
  }
  return d;
}

openai::Usage usage_of(HttpJob& job) {
  openai::Usage u;
  for (const HttpChoice& c : job.choices()) {
    if (c.index % job.request().n == 0) u.prompt_tokens += c.prompt_tokens;  // once per prompt
    u.completion_tokens += c.completion_tokens;
  }
  return u;
}

}  // namespace

void OpenAiHttpServer::Impl::handle_models(const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/models";
  if (auto e = check_key(config.server.api_keys, req)) return reply_error(res, *e, endpoint);
  auto entry = [&](const std::string& id, const std::string& kind, const ServedModel& m) {
    return Json{{"id", id},
                {"object", "model"},
                {"created", started_unix},
                {"owned_by", "helios"},
                {"max_model_len", m.context_tokens},
                {"helios", {{"kind", kind}, {"path", m.entry.path}, {"loaded_layers", m.engine->status().loaded_layers}}}};
  };
  Json data = Json::array();
  for (ServedModel* m : access.models()) data.push_back(entry(m->entry.name, "model", *m));
  for (ModelGroup* g : access.groups()) {
    if (const auto m = g->current()) data.push_back(entry(g->name(), "group", *m));
  }
  if (req.matches.size() > 1) {  // GET /v1/models/{id}
    const std::string id = req.matches[1];
    for (const Json& m : data) {
      if (m["id"] == id) return reply_json(res, m, endpoint);
    }
    ApiError e = openai::error_from_status(StatusCode::kNotFound, "the model '" + id + "' does not exist");
    return reply_error(res, e, endpoint);
  }
  reply_json(res, Json{{"object", "list"}, {"data", std::move(data)}}, endpoint);
}

void OpenAiHttpServer::Impl::handle_generate(const httplib::Request& req, httplib::Response& res,
                                             openai::Endpoint endpoint) {
  const std::string name = endpoint == openai::Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
  if (auto e = check_key(config.server.api_keys, req)) return reply_error(res, *e, name);
  Json body;
  try {
    body = Json::parse(req.body);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    return reply_error(res, openai::invalid_request("", std::string("the request body is not JSON: ") + e.what()), name);
  }
  std::random_device rd;
  const uint64_t random_seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  auto parsed = openai::parse_request(body, endpoint, config.limits, random_seed);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply_error(res, *e, name);
  auto job = std::make_shared<HttpJob>(*this, std::move(std::get<openai::Request>(parsed)));
  if (auto e = job->submit()) return reply_error(res, *e, name);
  const openai::Request& r = job->request();
  auto writer = std::make_shared<openai::ResponseWriter>(r, job->id(), static_cast<int64_t>(std::time(nullptr)),
                                                         job->model_name(), job->tokenizer());
  spdlog::debug("{}: {} choice(s) queued on {} (HTTP)", job->id(), job->choices().size(), job->model_name());

  if (!r.stream) {
    std::vector<openai::ChoiceOutput> outputs(job->choices().size());
    while (!job->all_done()) {
      for (auto& [c, update] : job->poll(kPollInterval)) {
        if (auto e = HttpJob::update_error(update)) {
          job->abort_unfinished();
          spdlog::warn("{}: ended by the server: {}", job->id(), e->message);
          return reply_error(res, *e, name);
        }
        openai::ChoiceOutput d = take_update(*job, *c, update);
        openai::ChoiceOutput& o = outputs[c - job->choices().data()];
        o.index = d.index;
        o.model = d.model;
        o.text += d.text;
        o.tokens.insert(o.tokens.end(), d.tokens.begin(), d.tokens.end());
        if (!d.finish_reason.empty()) {
          o.finish_reason = d.finish_reason;
          o.tool_calls = d.tool_calls;
        }
      }
    }
    job->log_done();
    return reply_json(res, writer->response(outputs, usage_of(*job)), name);
  }

  // Streaming: one provider call writes the whole stream, so that a server stopping meanwhile
  // does not cut it between chunks; a failed write (the client is gone) aborts the request.
  count(name, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, writer](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto gone = [&] {
          job->abort_unfinished();
          spdlog::info("{}: the client went away; aborted", job->id());
          return false;
        };
        const openai::Request& r = job->request();
        std::vector<bool> started(job->choices().size(), false);
        auto last_write = Clock::now();
        while (!job->all_done()) {
          auto updates = job->poll(kPollInterval);
          for (auto& [c, update] : updates) {
            if (auto e = HttpJob::update_error(update)) {
              job->abort_unfinished();
              spdlog::warn("{}: ended by the server: {}", job->id(), e->message);
              if (e->http_status >= 500) access.count_error();
              write(openai::sse_event(e->to_json()));
              write(std::string(openai::kSseDone));
              sink.done();
              return true;
            }
            openai::ChoiceOutput d = take_update(*job, *c, update);
            const size_t i = c - job->choices().data();
            d.first = !started[i];
            const bool wanted = !d.text.empty() || !d.finish_reason.empty() || d.first ||
                                (!d.tokens.empty() && (r.logprobs || r.return_tokens));
            if (!wanted) continue;
            started[i] = true;
            if (!write(openai::sse_event(writer->chunk({d})))) return gone();
            last_write = Clock::now();
          }
          if (updates.empty() && Clock::now() - last_write > kKeepAliveInterval) {
            if (!write(": keep-alive\n\n")) return gone();
            last_write = Clock::now();
          }
        }
        if (r.include_usage && !write(openai::sse_event(writer->usage_chunk(usage_of(*job))))) return gone();
        if (!write(std::string(openai::kSseDone))) return gone();
        sink.done();
        job->log_done();
        return true;
      },
      [job](bool success) {
        if (!success) job->abort_unfinished();  // the connection failed before the end
      });
}

OpenAiHttpServer::OpenAiHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiHttpServer::~OpenAiHttpServer() { stop(0); }

int OpenAiHttpServer::port() const { return impl_->port; }

StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::start(const HeliosConfig& config,
                                                                    MetricsRegistry& metrics,
                                                                    HttpServerAccess access) {
  auto impl = std::make_unique<Impl>(config, metrics, std::move(access));
  Impl* s = impl.get();
  const ServerConfig& sc = config.server;
  // A write to a client that has gone away must fail, not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  if (!sc.tls_cert_path.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(sc.tls_cert_path.c_str(), sc.tls_key_path.c_str());
    if (!ssl->is_valid()) {
      return unavailable("HTTP API: cannot use the TLS certificate '" + sc.tls_cert_path + "' and key '" +
                         sc.tls_key_path + "'");
    }
    s->http = std::move(ssl);
  } else {
    s->http = std::make_unique<httplib::Server>();
  }
  httplib::Server& http = *s->http;
  const size_t threads = static_cast<size_t>(sc.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);  // stream chunks leave as they are written
  http.set_payload_max_length(size_t{64} << 20);  // a larger body gets 413

  http.Get("/health", [s](const httplib::Request&, httplib::Response& res) {
    const std::string state = s->access.state();
    res.status = state == "serving" ? 200 : 503;
    res.set_content(openai::dump(Json{{"status", state}}), "application/json");
  });
  http.Get("/v1/models", [s](const httplib::Request& req, httplib::Response& res) { s->handle_models(req, res); });
  http.Get(R"(/v1/models/(.+))", [s](const httplib::Request& req, httplib::Response& res) { s->handle_models(req, res); });
  http.Post("/v1/completions", [s](const httplib::Request& req, httplib::Response& res) {
    s->handle_generate(req, res, openai::Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [s](const httplib::Request& req, httplib::Response& res) {
    s->handle_generate(req, res, openai::Endpoint::kChat);
  });
  // Every error response without a body (an unknown route, a malformed request) gets an OpenAI one.
  http.set_error_handler(httplib::Server::HandlerWithResponse([s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    if (res.status == 404) {
      e.code = "unknown_route";
      e.message = "unknown route " + req.method + " " + req.path +
                  "; this server has GET /v1/models, GET /health, POST /v1/completions and POST /v1/chat/completions";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    res.set_content(openai::dump(e.to_json()), "application/json");
    s->count("unknown", res.status);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([s](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    spdlog::error("HTTP {} {}: {}", req.method, req.path, what);
    ApiError e = openai::error_from_status(StatusCode::kInternal, "internal error: " + what);
    s->reply_error(res, e, "unknown");
  });

  // HOST:PORT ([v6]:PORT), checked by the config.
  const std::string& listen = sc.http_listen;
  const size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const int want = std::stoi(listen.substr(colon + 1));
  if (want == 0) {
    s->port = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, want)) {
    s->port = want;
  }
  if (s->port <= 0) return unavailable("cannot listen on " + listen + " for the HTTP API (address in use?)");
  s->listener = std::thread([s] { s->http->listen_after_bind(); });
  // stop() works only once it listens.
  for (int i = 0; i < 500 && !http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  spdlog::info("HTTP (OpenAI API) on {}:{}{}", host, s->port, sc.tls_cert_path.empty() ? "" : " (TLS)");
  return std::unique_ptr<OpenAiHttpServer>(new OpenAiHttpServer(std::move(impl)));
}

void OpenAiHttpServer::stop(double wait_s) {
  Impl& s = *impl_;
  if (!s.http) return;
  {
    std::unique_lock lock(s.jobs_mu);
    const auto deadline = Clock::now() + std::chrono::duration<double>(wait_s);
    s.jobs_cv.wait_until(lock, deadline, [&] { return s.jobs.empty(); });
    if (!s.jobs.empty()) {
      spdlog::warn("HTTP: ending {} requests still open", s.jobs.size());
      for (HttpJob* job : s.jobs) job->end_from_server("the server shut down before this request finished");
      s.jobs_cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.jobs.empty(); });
    }
  }
  s.http->stop();
  if (s.listener.joinable()) s.listener.join();
  s.http.reset();
}

}  // namespace helios::server
