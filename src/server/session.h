// The Session RPC: a generation that pauses at its intercepts (tool calls, human turns, trigger
// strings or tokens) and resumes in place when the client answers.
//
// One session is one engine request (its id is the engine's client id, so Abort finds it) and one
// bidirectional stream. It is served by a callback reactor with a thread of its own: gRPC reads
// the client's messages into a queue (one read always outstanding), and the thread waits on that
// queue and the engine's stream together, writes each engine update as a SessionResponse, and
// while the generation is paused turns the client's resume into tokens (session_turns.h) for
// Engine::resume, or ends it. The callback API rather than the synchronous one because a session
// must be able to end (the generation finished, a timeout, an error) while a read of the client's
// next message is still outstanding: a reactor's Finish() completes that read, where a
// synchronous handler could only return after it.
//
// How it ends:
//   the generation finishes (stop, EOS, length; `end` while paused: STOP)  → OK, after the final message
//   `end` while generating, or Abort                                       → OK, finish ABORTED
//   client half-close while paused                                         → as `end`
//   paused longer than intercepts.paused_idle_timeout_s without an answer  → DEADLINE_EXCEEDED
//   cancellation or the client's deadline                                  → the request is aborted
//   a resume when not paused                                               → FAILED_PRECONDITION
//   anything invalid                                                       → INVALID_ARGUMENT naming the field
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "helios/engine.h"
#include "helios/v1/helios.grpc.pb.h"
#include "server/model_group.h"
#include "server/request_convert.h"
#include "server/served_model.h"
#include "server/session_turns.h"

namespace helios::server {

grpc::Status to_grpc_status(const Status& s);

// The engine's intercept options from a SessionOpen's (INVALID_ARGUMENT naming intercept.FIELD).
StatusOr<InterceptOptions> to_intercept_options(const v1::InterceptOptions& options, int32_t n_vocab);

// A SessionResume's input (INVALID_ARGUMENT when it sets none).
StatusOr<ResumeInput> to_resume_input(const v1::SessionResume& resume);

// A SessionOpen converted: the engine request (prompt, sampling, exit rule, intercepts) and the
// session's turns (its conversation, for tool results and user turns).
struct PreparedSession {
  GenerationRequest request;
  std::unique_ptr<SessionTurns> turns;
};
StatusOr<PreparedSession> prepare_session(const v1::SessionOpen& open, const Model& model,
                                          const RequestLimits& limits);

// A session the server has opened: its request submitted to an engine.
struct OpenedSession {
  std::string id;                 // the engine's client id
  ServedModel* served = nullptr;  // the engine it runs on (a group's: kept by `route`)
  ModelGroup* group = nullptr;    // with `route` when the model is a group
  std::optional<GroupRoute> route;
  std::string model_name;         // GeneratedToken.model
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<SessionTurns> turns;
  RequestLimits limits;
  int32_t open_max_tokens = 0;    // SessionOpen's request.max_tokens (0 = the server's default)
  int32_t prompt_tokens = 0;
  std::shared_ptr<void> hold;     // released when the session ends (the request id's claim)
  std::function<void()> count_error;
};

// Opens a session from its first message (the server's part: the model, the group's route,
// capacity, the request id, submit). Runs on the session's thread; may block (a group loading).
using SessionOpener = std::function<grpc::Status(const v1::SessionOpen& open, OpenedSession* session)>;

// The reactor for one Session call. `precheck` not OK (authentication): the call ends with it at
// once. `idle_timeout_s`: intercepts.paused_idle_timeout_s (also the wait for the `open`).
grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* start_session(grpc::CallbackServerContext* ctx,
                                                                              grpc::Status precheck,
                                                                              double idle_timeout_s,
                                                                              SessionOpener opener);

}  // namespace helios::server
