// Proto ↔ engine: validates a GenerateRequest field by field and turns it into a
// GenerationRequest, and turns engine updates into GenerateResponse messages. No RPC state.
#pragma once

#include "helios/chat_template.h"
#include "helios/config.h"
#include "helios/engine.h"
#include "helios/v1/helios.pb.h"

namespace helios::server {

struct RequestLimits {
  LimitsConfig limits;
  int32_t context_tokens = 0;  // the model's context, or the KV cache's capacity if smaller
  EarlyExitConfig early_exit;  // the model's default exit rule and what requests may change
};

// INVALID_ARGUMENT naming the field (e.g. "sampling.top_p must be in (0, 1], got 1.5",
// "exit.policy: 'batch-sync' is not allowed on this server; allowed: full, per-token").
// `tools_json`: tool definitions (a JSON list) for the chat template of a conversation or chat
// text (SessionOpen.tools_json); "" = none. `reply_prefix`: the start of the assistant's reply,
// written after the template's generation prompt as template text (the OpenAI API's tool_choice
// "required": the opening of a call); "" = none.
StatusOr<GenerationRequest> to_generation_request(const v1::GenerateRequest& request,
                                                  const Model& model, const RequestLimits& limits,
                                                  const std::string& tools_json = "",
                                                  const std::string& reply_prefix = "");

// A conversation's messages (roles system, user, assistant, tool, with their tool fields) and
// tools, checked (INVALID_ARGUMENT naming conversation.messages[i].FIELD), for the chat template.
StatusOr<ChatRequest> to_chat_request(const v1::Conversation& conversation, const std::string& tools_json = "");

void to_response(const GenerationUpdate& update, const std::string& request_id,
                 v1::GenerateResponse* response);

}  // namespace helios::server
