#include "server/session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

namespace helios::server {
namespace {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// What a group hears of a routed request that ended without its final update.
GenerationUpdate cancelled_update() {
  GenerationUpdate u;
  u.finish = FinishReason::kAborted;
  return u;
}

void to_session_response(const GenerationUpdate& update, const std::string& id, const std::string& model_name,
                         int32_t segment, v1::SessionResponse* out) {
  v1::GenerateResponse g;
  to_response(update, id, &g);
  out->set_session_id(id);
  out->set_segment(segment);
  for (int i = 0; i < g.tokens_size(); ++i) {
    g.mutable_tokens(i)->set_model(model_name);
    g.mutable_tokens(i)->set_loaded_depth(update.tokens[i].loaded_layers);
  }
  out->mutable_tokens()->Swap(g.mutable_tokens());
  if (update.intercept) {
    const InterceptEvent& e = *update.intercept;
    v1::Intercept* i = out->mutable_intercept();
    i->set_trigger(e.trigger);
    i->set_matched(valid_utf8(e.matched));
    i->set_text(valid_utf8(e.text));
    i->set_tool_name(valid_utf8(e.tool_name));
    i->set_arguments_json(valid_utf8(e.arguments_json));
    i->set_parse_error(valid_utf8(e.parse_error));
    i->set_index(e.index);
    i->set_context_tokens(e.context_tokens);
  }
  if (update.finish != FinishReason::kNone) {
    out->set_finish_reason(g.finish_reason());
    *out->mutable_usage() = g.usage();
    *out->mutable_timings() = g.timings();
  }
}

}  // namespace

StatusOr<ResumeInput> to_resume_input(const v1::SessionResume& r) {
  ResumeInput in;
  switch (r.input_case()) {
    case v1::SessionResume::kText:
      in.kind = ResumeInput::Kind::kText;
      in.text = r.text();
      break;
    case v1::SessionResume::kTokenIds:
      in.kind = ResumeInput::Kind::kTokenIds;
      in.token_ids.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      break;
    case v1::SessionResume::kToolResult:
      in.kind = ResumeInput::Kind::kToolResult;
      in.text = r.tool_result().content();
      in.name = r.tool_result().name();
      in.tool_call_id = r.tool_result().tool_call_id();
      break;
    case v1::SessionResume::kUserTurn:
      in.kind = ResumeInput::Kind::kUserTurn;
      in.text = r.user_turn();
      break;
    default:
      return invalid_argument("resume sets no input: set text, tool_result, user_turn or token_ids");
  }
  return in;
}

namespace {

// One Session call. The reactor's callbacks only queue what happened and wake the session's
// thread (run()), which does everything else; it is the only caller of StartWrite and Finish.
class SessionReactor final : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  SessionReactor(grpc::CallbackServerContext* ctx, grpc::Status precheck, double idle_timeout_s, SessionOpener opener)
      : ctx_(ctx), idle_timeout_s_(idle_timeout_s), opener_(std::move(opener)) {
    if (!precheck.ok()) {
      finishing_ = true;
      Finish(precheck);
      return;
    }
    StartRead(&incoming_);
    worker_ = std::thread([this] { run(); });
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ok) inbox_.push_back(std::move(incoming_));
      else read_closed_ = true;  // the client half-closed, or the call is over
    }
    cv_.notify_all();
    if (ok && !finishing_) {
      incoming_.Clear();
      StartRead(&incoming_);
    }
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_ok_ = ok;
      write_done_ = true;
    }
    cv_.notify_all();
  }

  void OnCancel() override {
    cancelled_ = true;
    cv_.notify_all();
  }

  void OnDone() override {
    // Finish() may run this on the worker itself, which touches nothing after it.
    if (worker_.joinable()) {
      if (worker_.get_id() == std::this_thread::get_id()) worker_.detach();
      else worker_.join();
    }
    delete this;
  }

 private:
  void run() {
    grpc::Status status = serve();
    finishing_ = true;
    Finish(status);  // may delete this
  }

  bool cancelled() const { return cancelled_ || ctx_->IsCancelled(); }

  bool write(const v1::SessionResponse& response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_done_ = false;
    }
    StartWrite(&response);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return write_done_; });
    return write_ok_;
  }

  // The next client message, waiting up to `wait` for one; nullopt when none came. *closed: the
  // client will send no more.
  std::optional<v1::SessionRequest> next_message(std::chrono::milliseconds wait, bool* closed) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait.count() > 0) {
      cv_.wait_for(lock, wait, [&] { return !inbox_.empty() || read_closed_ || cancelled_.load(); });
    }
    *closed = read_closed_ && inbox_.empty();
    if (inbox_.empty()) return std::nullopt;
    v1::SessionRequest m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

  grpc::Status serve() {
    // The open: the first message.
    const auto open_deadline = Clock::now() + std::chrono::duration<double>(idle_timeout_s_);
    std::optional<v1::SessionRequest> first;
    for (;;) {
      bool closed = false;
      first = next_message(std::chrono::milliseconds(50), &closed);
      if (first) break;
      if (cancelled()) return {StatusCode::CANCELLED, "cancelled"};
      if (closed) break;
      if (Clock::now() > open_deadline) {
        return {StatusCode::DEADLINE_EXCEEDED, "no `open` within " + num(idle_timeout_s_) + " s of the call"};
      }
    }
    if (!first || !first->has_open()) {
      return {StatusCode::INVALID_ARGUMENT, "the first message of a session must be `open`"};
    }
    OpenedSession s;
    if (grpc::Status st = opener_(first->open(), &s); !st.ok()) return st;
    return serve_opened(s);
  }

  // Ends the engine request for an RPC that ends without its final update.
  void drop(OpenedSession& s) {
    s.served->engine->abort(s.id);
    if (s.route) s.group->on_update(*s.route, cancelled_update());
  }

  grpc::Status fail(OpenedSession& s, const Status& status) {
    drop(s);
    spdlog::info("{}: session ended: {}", s.id, status.message());
    return to_grpc_status(status);
  }

  grpc::Status serve_opened(OpenedSession& s) {
    Engine& engine = *s.served->engine;
    int32_t segment = 0;
    bool paused = false;
    bool ending = false;  // end_paused or abort sent: the final update is coming
    int64_t context = s.prompt_tokens;
    Clock::time_point paused_at;
    int32_t loaded_depth = engine.status().loaded_layers;
    for (;;) {
      if (cancelled()) {
        drop(s);
        spdlog::info("{}: session cancelled by the client", s.id);
        return {StatusCode::CANCELLED, "cancelled"};
      }
      // The engine: waited for while it generates, looked at while paused (an Abort ends it there).
      auto update = s.stream->pop(std::chrono::milliseconds(paused && !ending ? 0 : 20));
      if (update) {
        if (s.route) s.group->on_update(*s.route, *update);
        for (const TokenEvent& t : update->tokens) s.turns->add_generated(t.text);
        context += static_cast<int64_t>(update->tokens.size());
        if (!update->tokens.empty()) loaded_depth = update->tokens.back().loaded_layers;
        const bool server_ended = update->finish == FinishReason::kAborted && !update->error.empty();
        v1::SessionResponse response;
        to_session_response(*update, s.id, s.model_name, segment, &response);
        if (server_ended) {
          response.clear_finish_reason();
          response.clear_usage();
          response.clear_timings();
        }
        if ((!server_ended || response.tokens_size() > 0 || response.has_intercept()) && !write(response)) {
          engine.abort(s.id);
          if (s.route && update->finish == FinishReason::kNone) s.group->on_update(*s.route, cancelled_update());
          return {StatusCode::CANCELLED, "the client went away"};
        }
        if (server_ended) {
          if (s.count_error) s.count_error();
          spdlog::warn("{}: session ended by the server: {}", s.id, update->error);
          return to_grpc_status(helios::Status(update->error_code, update->error));
        }
        if (update->finish != FinishReason::kNone) {
          spdlog::info("{}: session of {} segments: {} prompt + {} generated tokens on {} ({} layers), total {:.3f} s",
                       s.id, segment + 1, update->prompt_tokens, update->completion_tokens, s.model_name,
                       loaded_depth, update->total_seconds);
          return grpc::Status::OK;
        }
        if (update->intercept) {
          paused = true;
          paused_at = Clock::now();
          s.turns->on_pause(*update->intercept);
          spdlog::debug("{}: paused at {} ({} '{}'), {} tokens of context", s.id, update->intercept->index,
                        update->intercept->trigger, update->intercept->matched, context);
        }
      }
      // The client: waited for while paused, looked at between updates otherwise.
      bool closed = false;
      auto message = next_message(std::chrono::milliseconds(paused && !ending && !update ? 20 : 0), &closed);
      if (message) {
        switch (message->action_case()) {
          case v1::SessionRequest::kOpen:
            return fail(s, invalid_argument("only the first message of a session is `open`"));
          case v1::SessionRequest::kEnd:
            if (ending) break;
            ending = true;
            if (paused) {
              if (Status st = engine.end_paused(s.id); !st.ok()) return fail(s, st);
            } else {
              engine.abort(s.id);  // the final update says ABORTED
            }
            break;
          case v1::SessionRequest::kResume: {
            if (!paused || ending) {
              return fail(s, failed_precondition(ending ? "the session is ending: no resume after `end`"
                                                        : "the session is not paused: a resume answers an intercept"));
            }
            const v1::SessionResume& r = message->resume();
            if (r.max_tokens() < 0) {
              return fail(s, invalid_argument("resume.max_tokens must be > 0 (0 = the open's), got " +
                                              std::to_string(r.max_tokens())));
            }
            if (r.max_tokens() > s.limits.limits.max_tokens) {
              return fail(s, invalid_argument("resume.max_tokens is " + std::to_string(r.max_tokens()) +
                                              ", above the server's limit of " +
                                              std::to_string(s.limits.limits.max_tokens)));
            }
            auto input = to_resume_input(r);
            if (!input.ok()) return fail(s, input.status());
            auto tokens = s.turns->resume(*input);
            if (!tokens.ok()) return fail(s, tokens.status());
            const int64_t used = context + static_cast<int64_t>(tokens->size());
            const int64_t left = s.limits.context_tokens - used;
            int64_t max_tokens = r.max_tokens();
            if (max_tokens == 0) {
              max_tokens = std::min<int64_t>(s.open_max_tokens > 0 ? s.open_max_tokens
                                                                  : s.limits.limits.default_max_tokens,
                                             left);
            }
            if (max_tokens < 1 || max_tokens > left) {
              return fail(s, invalid_argument("resume: the context (" + std::to_string(used) +
                                              " tokens with this resume's) leaves " +
                                              std::to_string(std::max<int64_t>(left, 0)) + " of the " +
                                              std::to_string(s.limits.context_tokens) + " tokens for " +
                                              (r.max_tokens() > 0 ? "max_tokens " + std::to_string(max_tokens)
                                                                  : std::string("the next segment"))));
            }
            const auto n_appended = static_cast<int64_t>(tokens->size());
            if (Status st = engine.resume(s.id, std::move(*tokens), static_cast<int32_t>(max_tokens)); !st.ok()) {
              return fail(s, st);
            }
            context += n_appended;
            ++segment;
            paused = false;
            spdlog::debug("{}: resumed with {} tokens, segment {}", s.id, n_appended, segment);
            break;
          }
          default:
            return fail(s, invalid_argument("a session message must set open, resume or end"));
        }
        continue;
      }
      if (!paused || ending) continue;
      if (closed) {  // the client half-closed while paused: it will never answer
        ending = true;
        if (Status st = engine.end_paused(s.id); !st.ok()) return fail(s, st);
        continue;
      }
      const double idle = std::chrono::duration<double>(Clock::now() - paused_at).count();
      if (idle > idle_timeout_s_) {
        drop(s);
        if (s.count_error) s.count_error();
        spdlog::info("{}: session paused for {:.1f} s without an answer: ended", s.id, idle);
        return {StatusCode::DEADLINE_EXCEEDED, "the session was paused for " + num(idle_timeout_s_) +
                                                   " s without an answer (intercepts.paused_idle_timeout_s)"};
      }
    }
  }

  grpc::CallbackServerContext* ctx_;
  const double idle_timeout_s_;
  SessionOpener opener_;
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;
  v1::SessionRequest incoming_;  // the read in flight
  std::deque<v1::SessionRequest> inbox_;
  bool read_closed_ = false;
  bool write_done_ = false, write_ok_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finishing_{false};
};

}  // namespace

grpc::Status to_grpc_status(const Status& s) {
  switch (s.code()) {
    case helios::StatusCode::kOk: return grpc::Status::OK;
    case helios::StatusCode::kInvalidArgument: return {StatusCode::INVALID_ARGUMENT, s.message()};
    case helios::StatusCode::kNotFound: return {StatusCode::NOT_FOUND, s.message()};
    case helios::StatusCode::kAlreadyExists: return {StatusCode::ALREADY_EXISTS, s.message()};
    case helios::StatusCode::kResourceExhausted: return {StatusCode::RESOURCE_EXHAUSTED, s.message()};
    case helios::StatusCode::kUnavailable: return {StatusCode::UNAVAILABLE, s.message()};
    case helios::StatusCode::kOutOfRange: return {StatusCode::OUT_OF_RANGE, s.message()};
    case helios::StatusCode::kFailedPrecondition: return {StatusCode::FAILED_PRECONDITION, s.message()};
    case helios::StatusCode::kUnimplemented: return {StatusCode::UNIMPLEMENTED, s.message()};
    default: return {StatusCode::INTERNAL, s.message()};
  }
}

StatusOr<InterceptOptions> to_intercept_options(const v1::InterceptOptions& options, int32_t n_vocab) {
  InterceptOptions out;
  for (int i = 0; i < options.triggers_size(); ++i) {
    if (options.triggers(i).empty()) return invalid_argument("intercept.triggers[" + std::to_string(i) + "] is empty");
    out.triggers.strings.push_back(options.triggers(i));
  }
  for (int i = 0; i < options.trigger_token_ids_size(); ++i) {
    const int32_t id = options.trigger_token_ids(i);
    if (id < 0 || id >= n_vocab) {
      return invalid_argument("intercept.trigger_token_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                              " is not a token of this model (0.." + std::to_string(n_vocab - 1) + ")");
    }
    out.triggers.token_ids.push_back(id);
  }
  out.triggers.tool_calls = options.tool_calls();
  out.triggers.end_of_turn = options.end_of_turn();
  out.triggers.on_length = options.on_length();
  if (!options.hold().empty()) {
    out.hold = parse_hold_policy(options.hold());
    if (!out.hold) {
      std::string valid;
      for (HoldPolicy p : {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve,
                           HoldPolicy::kSwap, HoldPolicy::kMinWaste}) {
        valid += (valid.empty() ? "" : ", ") + std::string(hold_policy_name(p));
      }
      return invalid_argument("intercept.hold: '" + options.hold() + "' is not a hold policy; valid: " + valid +
                              " (\"\" = the server's intercepts.hold)");
    }
  }
  out.kind = options.kind();
  return out;
}

StatusOr<PreparedSession> prepare_session(const v1::SessionOpen& open, const Model& model,
                                          const RequestLimits& limits) {
  PreparedSession out;
  HELIOS_ASSIGN_OR_RETURN(out.request, to_generation_request(open.request(), model, limits, open.tools_json()));
  HELIOS_ASSIGN_OR_RETURN(out.request.intercept, to_intercept_options(open.intercept(), model.config().n_vocab));
  std::optional<ChatRequest> conversation;
  const v1::GenerateRequest& req = open.request();
  if (req.input_case() == v1::GenerateRequest::kConversation) {
    HELIOS_ASSIGN_OR_RETURN(conversation, to_chat_request(req.conversation(), open.tools_json()));
  } else if (req.input_case() == v1::GenerateRequest::kText && req.chat()) {
    ChatRequest chat;
    chat.messages.push_back({"user", req.text()});
    chat.tools_json = open.tools_json();
    conversation = std::move(chat);
  }
  out.turns = std::make_unique<SessionTurns>(model.tokenizer(), std::move(conversation),
                                             out.request.intercept.triggers.tool_call_open);
  return out;
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* start_session(grpc::CallbackServerContext* ctx,
                                                                              grpc::Status precheck,
                                                                              double idle_timeout_s,
                                                                              SessionOpener opener) {
  return new SessionReactor(ctx, std::move(precheck), idle_timeout_s, std::move(opener));
}

}  // namespace helios::server
