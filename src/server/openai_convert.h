// The OpenAI-compatible API's JSON ↔ the server's requests, pure (no sockets, no engine): request
// bodies of /v1/completions and /v1/chat/completions become v1::GenerateRequest messages, so the
// gRPC path's to_generation_request does every check the two APIs share (sampling ranges,
// max_tokens and the context, stop strings, the exit rule, the prompt against the model); the
// engine's tokens become OpenAI's response objects and stream chunks; a model's tool-call markup
// becomes `tool_calls`. openai_http.cpp serves them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "helios/config.h"
#include "helios/engine.h"
#include "helios/intercept.h"
#include "helios/json_grammar.h"
#include "helios/tokenizer.h"
#include "helios/v1/helios.pb.h"

namespace helios::server::openai {

using Json = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChat };

// Completions: prompts × n choices in one request, at most.
inline constexpr int32_t kMaxChoicesPerRequest = 64;
// The default max_tokens of /v1/completions (OpenAI's); chat's is the server's default_max_tokens.
inline constexpr int32_t kCompletionsDefaultMaxTokens = 16;

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
  Json to_json() const;
};

ApiError invalid_request(std::string param, std::string message);  // 400 naming the field

// A Status of the server (to_generation_request, a group's route, submit, an engine's end) as the
// HTTP API reports it: INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429 (a full queue),
// UNAVAILABLE 503, UNAUTHENTICATED-like 401 is not a Status (see openai_http.cpp), the rest 500.
ApiError error_from_status(StatusCode code, const std::string& message);

// A checked request, as GenerateRequests: what the HTTP layer submits.
struct Request {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                         // "" = the server's default
  // One per prompt (completions may send a list of prompts; chat: one conversation). Each holds
  // the prompt, sampling (its seed the request's), max_tokens, stop, logprobs and the exit rule.
  std::vector<v1::GenerateRequest> prompts;
  std::string tools_json;                    // chat: the tools, for the chat template; "" = none
  std::vector<std::string> tool_names;       // their function names
  bool parse_tool_calls = false;             // chat with tools: <tool_call> markup → tool_calls
  // tool_choice "required" or {"type": "function", "function": {"name": ...}}: the reply starts as
  // a call (of forced_tool when named) — forced_reply_prefix writes that start into the prompt.
  bool tool_required = false;
  std::string forced_tool;
  // With tool_required: the reply is held to a call (structured output, OutputOptions::json_grammars)
  // from past forced_call_start, one grammar per tool that may be called (forced_tool, or every
  // one): its name, and arguments of its `parameters` schema (any object when JsonGrammar does not
  // take the schema). Empty when nothing is forced.
  std::vector<std::shared_ptr<const JsonGrammar>> forced_call_grammars;
  int32_t n = 1;                             // choices per prompt; choice j gets seed + j
  bool stream = false;
  bool include_usage = false;                // stream_options.include_usage
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool return_tokens = false;                // helios.return_tokens: per-token exit layer and model
  std::string max_tokens_param = "max_tokens";  // what the request called it (errors name it)
  int32_t n_choices() const { return static_cast<int32_t>(prompts.size()) * n; }
};

// Parses and checks a request body. What only the OpenAI API has (types, n, stream_options,
// unsupported fields, the message and tool shapes) is checked here; what gRPC requests have too is
// left to to_generation_request. `random_seed` is the seed when the body has none.
std::variant<Request, ApiError> parse_request(const Json& body, Endpoint endpoint, const LimitsConfig& limits,
                                              uint64_t random_seed);

// An INVALID_ARGUMENT of to_generation_request, which names the gRPC fields
// ("sampling.top_p must be ...", "conversation.messages[0].role is ...", "text has 5000 tokens"),
// with the names this API gives them (top_p, messages[0].role, prompt / messages) in message
// and param.
ApiError from_conversion_error(const Status& status, const Request& request);

// The start of the reply that makes it a tool call (tool_choice "required" or a named function),
// written after the chat template's generation prompt: the template's markup and the JSON up to
// the function's name (required) or up to its arguments (named), as
// `<tool_call>\n{"name": "get_weather", "arguments": `. A template without the markup (`template`
// does not mention tool_call_open) gets the bare JSON, which ToolCallParser reads too. "" when
// the request forces nothing. The model then writes the rest, and ToolCallParser reads the prefix
// and the generated text as one.
std::string forced_reply_prefix(const Request& request, const std::string& chat_template,
                                const std::string& tool_call_open = kToolCallOpen);
// The JSON part of that prefix: `{"name": "`, or `{"name": "get_weather", "arguments": ` when named.
std::string forced_call_start(const Request& request);

// ---------------------------------------------------------------------------------------------
// Tool calls in the output: Qwen2.5 / Hermes markup, <tool_call>{"name": ..., "arguments": ...}</tool_call>.

struct ToolCall {
  std::string id;         // "call_..."
  std::string name;
  std::string arguments;  // compact JSON text of an object (OpenAI sends it as a string)
};

// Splits generated text into content and tool calls as it streams: text outside the markup is
// released as soon as it cannot be the start of an opening tag; text inside is held until the
// closing tag, then parsed (parse_tool_call). A body that does not parse stays in the content,
// markup and all, as does an unclosed call at the end whose body does not parse.
// Small models (Qwen2.5-Coder-0.5B) often answer with the bare {"name": ..., "arguments": ...},
// or that in a ```json fence, without the markup, and Llama 3's templates ask for
// {"name": ..., "parameters": ...}: a turn that starts with `{`, `[` or a fence is held to its end
// and is calls when it is nothing but calls (parse_bare_tool_calls: one, several, or a list),
// each naming one of `tool_names` (any name when empty).
class ToolCallParser {
 public:
  explicit ToolCallParser(std::vector<std::string> tool_names = {}, std::string open = kToolCallOpen,
                          std::string close = kToolCallClose);
  std::string feed(std::string_view text);  // the content released by this text
  std::string finish();                     // the content still held back; call once, at the end
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  std::string feed_markup(std::string_view text);
  void take_call(const std::string& body, std::string* content, bool closed);
  bool take_bare_calls(const std::string& text);

  std::vector<std::string> tool_names_;
  std::string open_, close_;
  std::string pending_;
  bool inside_ = false;
  enum class Start { kUndecided, kBare, kText } start_ = Start::kUndecided;
  std::vector<ToolCall> calls_;
};

// ---------------------------------------------------------------------------------------------
// Responses.

// What one choice released: a whole choice (non-streaming) or one stream chunk's share.
struct ChoiceOutput {
  int32_t index = 0;
  std::string text;                    // completions text, or chat content without tool-call markup
  std::vector<ToolCall> tool_calls;
  std::vector<TokenEvent> tokens;      // for logprobs and helios.tokens
  std::string model;                   // the model that produced them (a group's candidate)
  std::string finish_reason;           // "stop" | "length" | "tool_calls"; "" while it goes on
  bool first = false;                  // chat stream: the choice's first chunk (carries the role)
  int64_t text_offset = 0;             // completions logprobs: where `text` starts in the choice
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// "stop" (a stop string or token, or end of generation), "length"; "tool_calls" when it called.
std::string finish_reason_name(FinishReason reason, bool called_tools);

// Builds the response objects of one request.
class ResponseWriter {
 public:
  ResponseWriter(const Request& request, std::string id, int64_t created, std::string model,
                 const Tokenizer& tokenizer);
  const std::string& id() const { return id_; }
  // The whole response of a non-streaming request.
  Json response(const std::vector<ChoiceOutput>& choices, const Usage& usage) const;
  // One stream chunk with the given choices' deltas ("usage": null when include_usage).
  Json chunk(const std::vector<ChoiceOutput>& choices) const;
  // The last chunk of a stream with include_usage: no choices, the usage.
  Json usage_chunk(const Usage& usage) const;

 private:
  Json choice_json(const ChoiceOutput& c, bool stream) const;
  Json logprobs_json(const ChoiceOutput& c) const;
  Json base(const char* object) const;

  const Request& request_;
  std::string id_;
  int64_t created_;
  std::string model_;
  const Tokenizer& tokenizer_;
};

Json usage_json(const Usage& usage);

// JSON text for the wire: invalid UTF-8 (a token that splits a character) becomes U+FFFD.
std::string dump(const Json& j);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const Json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// A random id: prefix + n letters and digits (chatcmpl-..., cmpl-..., call_...).
std::string random_id(std::string_view prefix, size_t n = 24);

}  // namespace helios::server::openai
