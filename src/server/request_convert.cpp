#include "server/request_convert.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "helios/chat_template.h"
#include "helios/json_grammar.h"
#include "server/exit_options.h"

namespace helios::server {
namespace {

Status field_error(const std::string& field, const std::string& what) {
  return invalid_argument(field + " " + what);
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status convert_sampling(const v1::SamplingParams& p, int32_t n_vocab, SamplingParams* out) {
  if (!std::isfinite(p.temperature()) || p.temperature() < 0) {
    return field_error("sampling.temperature", "must be a finite number >= 0, got " + num(p.temperature()));
  }
  if (p.top_k() < 0) return field_error("sampling.top_k", "must be >= 0 (0 = off), got " + std::to_string(p.top_k()));
  if (!(p.top_p() >= 0 && p.top_p() <= 1)) {  // 0 is "not set"
    return field_error("sampling.top_p", "must be in (0, 1] (0 = not set), got " + num(p.top_p()));
  }
  if (!(p.min_p() >= 0 && p.min_p() <= 1)) return field_error("sampling.min_p", "must be in [0, 1], got " + num(p.min_p()));
  if (!(p.repetition_penalty() >= 0 && std::isfinite(p.repetition_penalty()))) {  // 0 is "not set"
    return field_error("sampling.repetition_penalty", "must be > 0 (1 = off, 0 = not set), got " +
                                                          num(p.repetition_penalty()));
  }
  out->temperature = p.temperature();
  out->top_k = p.top_k();
  out->top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  out->min_p = p.min_p();
  out->repetition_penalty = p.repetition_penalty() > 0 ? p.repetition_penalty() : 1.0f;
  out->seed = p.seed();
  for (const auto& [name, v] : {std::pair{"sampling.presence_penalty", p.presence_penalty()},
                                std::pair{"sampling.frequency_penalty", p.frequency_penalty()}}) {
    if (!(v >= -2 && v <= 2)) return field_error(name, "must be in [-2, 2] (0 = off), got " + num(v));
  }
  out->presence_penalty = p.presence_penalty();
  out->frequency_penalty = p.frequency_penalty();
  for (const auto& [token, bias] : p.logit_bias()) {
    const std::string field = "sampling.logit_bias." + std::to_string(token);
    if (token < 0 || token >= n_vocab) {
      return field_error(field, "names a token outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
    }
    if (!(bias >= -100 && bias <= 100)) return field_error(field, "must be in [-100, 100], got " + num(bias));
    out->logit_bias.emplace_back(token, bias);
  }
  std::sort(out->logit_bias.begin(), out->logit_bias.end());  // a map's order is unspecified
  return ok_status();
}

// The conversation as the model's chat template renders it; only the template's own text may
// become control tokens. A template that cannot run falls back to the recognised format: said at
// load when the template does not parse (served_model.cpp), here when it fails on this request.
StatusOr<std::vector<TokenId>> chat_prompt(const Tokenizer& tok, const ChatRequest& request, const std::string& field,
                                           const std::string& reply_prefix = "") {
  const ChatFormatter formatter(tok);
  auto prompt = formatter.format(request);
  if (!prompt.ok()) return Status(prompt.status().code(), field + " " + prompt.status().message());
  if (!reply_prefix.empty()) prompt->segments.push_back({reply_prefix, /*from_template=*/true});
  if (!prompt->fallback_reason.empty()) {
    if (formatter.template_problem().empty()) spdlog::warn("chat prompt: {}", prompt->fallback_reason);
    else spdlog::debug("chat prompt: {}", prompt->fallback_reason);
  }
  return formatter.encode(*prompt);
}

}  // namespace

StatusOr<ChatRequest> to_chat_request(const v1::Conversation& conversation, const std::string& tools_json) {
  const auto& messages = conversation.messages();
  if (messages.empty()) return field_error("conversation.messages", "is empty");
  ChatRequest chat;
  chat.tools_json = tools_json;
  for (int i = 0; i < messages.size(); ++i) {
    const v1::ChatMessage& m = messages[i];
    const std::string field = "conversation.messages[" + std::to_string(i) + "]";
    const std::string& role = m.role();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return field_error(field + ".role", "is '" + role + "'; valid: system, user, assistant, tool");
    }
    if (!m.tool_calls_json().empty() && role != "assistant") {
      return field_error(field + ".tool_calls_json", "is only for assistant messages (this one is '" + role + "')");
    }
    if ((!m.tool_call_id().empty() || !m.name().empty()) && role != "tool") {
      return field_error(field + (m.name().empty() ? ".tool_call_id" : ".name"),
                         "is only for tool messages (this one is '" + role + "')");
    }
    ChatMessage message(role, m.content());
    message.tool_calls_json = m.tool_calls_json();
    message.tool_call_id = m.tool_call_id();
    message.name = m.name();
    chat.messages.push_back(std::move(message));
  }
  return chat;
}

StatusOr<GenerationRequest> to_generation_request(const v1::GenerateRequest& request,
                                                  const Model& model, const RequestLimits& limits,
                                                  const std::string& tools_json, const std::string& reply_prefix) {
  const bool chat_input = request.input_case() == v1::GenerateRequest::kConversation || request.chat();
  if (!tools_json.empty() && !chat_input) {
    return field_error("tools_json", "needs a conversation (or chat text): tools are for the chat template");
  }
  if (!reply_prefix.empty() && !chat_input) {
    return field_error("reply_prefix", "needs a conversation (or chat text): it continues the assistant's turn");
  }
  GenerationRequest out;
  const Tokenizer& tok = model.tokenizer();
  const int32_t n_vocab = model.config().n_vocab;
  HELIOS_RETURN_IF_ERROR(convert_sampling(request.sampling(), n_vocab, &out.sampling));
  HELIOS_ASSIGN_OR_RETURN(out.exit, exit_rule_for_request(request.exit(), limits.early_exit, model));

  if (request.max_tokens() < 0) {
    return field_error("max_tokens", "must be > 0 (0 = the server's default), got " + std::to_string(request.max_tokens()));
  }
  if (request.max_tokens() > 0) {
    if (request.max_tokens() > limits.limits.max_tokens) {
      return field_error("max_tokens", "is " + std::to_string(request.max_tokens()) + ", above the server's limit of " +
                                           std::to_string(limits.limits.max_tokens));
    }
    out.max_tokens = request.max_tokens();
  } else {
    out.max_tokens = limits.limits.default_max_tokens;
  }
  if (request.logprobs()) {
    if (request.top_logprobs() < 0 || request.top_logprobs() > 20) {
      return field_error("top_logprobs", "must be in 0..20, got " + std::to_string(request.top_logprobs()));
    }
    out.top_logprobs = request.top_logprobs();
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    if (request.stop(i).empty()) return field_error("stop[" + std::to_string(i) + "]", "is empty");
    out.stop.push_back(request.stop(i));
  }
  for (int i = 0; i < request.stop_token_ids_size(); ++i) {
    const int32_t id = request.stop_token_ids(i);
    if (id < 0 || id >= n_vocab) {
      return field_error("stop_token_ids[" + std::to_string(i) + "]", "= " + std::to_string(id) +
                                                                        " is not a token of this model (0.." +
                                                                        std::to_string(n_vocab - 1) + ")");
    }
    out.stop_token_ids.push_back(id);
  }
  out.ignore_eos = request.ignore_eos();
  if (request.has_response_format()) {
    const v1::ResponseFormat& format = request.response_format();
    if (format.format_case() == v1::ResponseFormat::kJsonSchema) {
      auto grammars = JsonGrammar::from_schema_choice(format.json_schema());
      if (!grammars.ok()) return field_error("response_format.json_schema:", grammars.status().message());
      out.json_grammars = std::move(grammars).value();
    } else if (format.json_object()) {
      out.json_grammars = {JsonGrammar::any_object()};
    }
  }

  // The prompt.
  switch (request.input_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return field_error("text", "is empty");
      if (request.chat()) {
        ChatRequest chat;
        chat.messages.push_back({"user", request.text()});
        chat.tools_json = tools_json;
        HELIOS_ASSIGN_OR_RETURN(out.prompt, chat_prompt(tok, chat, "text", reply_prefix));
      } else {
        out.prompt = tok.encode(request.text(), /*add_special=*/true, /*parse_special=*/false);
      }
      break;
    }
    case v1::GenerateRequest::kConversation: {
      HELIOS_ASSIGN_OR_RETURN(ChatRequest chat, to_chat_request(request.conversation(), tools_json));
      HELIOS_ASSIGN_OR_RETURN(out.prompt, chat_prompt(tok, chat, "conversation.messages", reply_prefix));
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return field_error("token_ids", "is empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
          return field_error("token_ids[" + std::to_string(i) + "]", "= " + std::to_string(ids[i]) +
                                                                      " is outside the vocabulary (0.." +
                                                                      std::to_string(n_vocab - 1) + ")");
        }
      }
      out.prompt.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return field_error("input", "is missing: set text or token_ids");
  }
  if (out.prompt.empty()) return field_error("text", "gives no tokens");
  const auto n_prompt = static_cast<int32_t>(out.prompt.size());
  if (n_prompt > limits.limits.max_prompt_tokens) {
    return field_error("text", "has " + std::to_string(n_prompt) + " tokens, above the server's limit of " +
                                   std::to_string(limits.limits.max_prompt_tokens));
  }
  // Without a max_tokens of its own, a request gets the default or what the context leaves.
  if (request.max_tokens() == 0 && n_prompt < limits.context_tokens) {
    out.max_tokens = std::min(out.max_tokens, limits.context_tokens - n_prompt);
  }
  if (n_prompt + out.max_tokens > limits.context_tokens) {
    return field_error("max_tokens", "(" + std::to_string(out.max_tokens) + ") + the prompt (" +
                                         std::to_string(n_prompt) + " tokens) exceed the context of " +
                                         std::to_string(limits.context_tokens) + " tokens");
  }
  return out;
}

void to_response(const GenerationUpdate& update, const std::string& request_id,
                 v1::GenerateResponse* response) {
  response->set_request_id(request_id);
  for (const TokenEvent& ev : update.tokens) {
    v1::GeneratedToken* t = response->add_tokens();
    t->set_token_id(ev.id);
    t->set_text(ev.text);
    t->set_logprob(ev.logprob);
    t->set_exit_layer(ev.exit_layer);
    t->set_confidence(ev.confidence);
    for (const auto& [id, lp] : ev.top_logprobs) {
      v1::TokenLogprob* p = t->add_top_logprobs();
      p->set_token_id(id);
      p->set_logprob(lp);
    }
  }
  if (update.finish == FinishReason::kNone) return;
  switch (update.finish) {
    case FinishReason::kStop: response->set_finish_reason(v1::FINISH_REASON_STOP); break;
    case FinishReason::kEos: response->set_finish_reason(v1::FINISH_REASON_EOS); break;
    case FinishReason::kLength: response->set_finish_reason(v1::FINISH_REASON_LENGTH); break;
    default: response->set_finish_reason(v1::FINISH_REASON_ABORTED); break;
  }
  response->mutable_usage()->set_prompt_tokens(update.prompt_tokens);
  response->mutable_usage()->set_completion_tokens(update.completion_tokens);
  response->mutable_timings()->set_queue_seconds(update.queue_seconds);
  response->mutable_timings()->set_time_to_first_token_seconds(update.ttft_seconds);
  response->mutable_timings()->set_total_seconds(update.total_seconds);
}

}  // namespace helios::server
