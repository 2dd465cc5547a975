// Chat prompts: a conversation rendered with the model's own chat template
// (tokenizer.chat_template, run by the sandboxed interpreter in helios/jinja.h, as transformers'
// apply_chat_template renders it), then tokenized so that only text the template itself wrote can
// become control tokens: a message that spells "<|im_end|>" stays plain text.
//
// A template the interpreter cannot run (or a model without one) falls back to the format
// recognised from the template's markers or the vocabulary (ChatML, Llama 2, Llama 3), and the
// prompt says why (ChatPrompt::fallback_reason) so that the caller logs it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "helios/jinja.h"
#include "helios/status.h"
#include "helios/tokenizer.h"

namespace helios {

// One turn, as chat APIs carry it.
struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}

  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
  // Assistant turns: the tool calls made, a JSON list in the OpenAI form
  // ([{"id": ..., "type": "function", "function": {"name": ..., "arguments": {...}}}]); "" = none.
  // Arguments given as a JSON string holding an object are passed to the template as that object.
  std::string tool_calls_json;
  std::string tool_call_id;  // tool turns: the call answered
  std::string name;          // tool turns: the tool's name
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::string tools_json;             // JSON list of tool definitions; "" = none (the template sees none)
  bool add_generation_prompt = true;  // end with the opening of the assistant's turn
};

// A run of prompt text: written by the template (may spell control tokens) or copied from the
// conversation (plain text whatever it spells).
struct ChatSegment {
  std::string text;
  bool from_template = false;
};

struct ChatPrompt {
  std::vector<ChatSegment> segments;
  // Non-empty when the model's template was not run: why, and which format was used instead.
  std::string fallback_reason;
  std::string text() const;
};

class ChatFormatter {
 public:
  // Parses the tokenizer's chat template once; `tokenizer` must outlive the formatter.
  explicit ChatFormatter(const Tokenizer& tokenizer);

  // Why no prompt of this model will run its template (none, or one the interpreter cannot
  // parse), with the format used instead; "" when the template parsed. For a load-time log line.
  const std::string& template_problem() const { return problem_; }

  // INVALID_ARGUMENT when the template refuses the conversation (its raise_exception) or the
  // tools / tool calls are not valid JSON; RESOURCE_EXHAUSTED past the interpreter's limits.
  StatusOr<ChatPrompt> format(const ChatRequest& request, const jinja::RenderOptions& options = {}) const;

  // The prompt's tokens: template text with special-token parsing, conversation text without
  // (tokenized as one text, so words are split as in the whole string). BOS as the tokenizer
  // adds it, but never twice when the template wrote it too.
  std::vector<TokenId> encode(const ChatPrompt& prompt) const;

 private:
  ChatPrompt fallback(const ChatRequest& request, const std::string& reason) const;

  const Tokenizer& tokenizer_;
  std::optional<jinja::Template> template_;
  std::string problem_;
};

// The format recognised from markers, as a prompt: ChatML (with the template's default system
// turn), Llama 2 ([INST]), Llama 3 (headers), or the contents joined when there is none.
ChatPrompt format_recognised_chat(const TokenizerSpec& spec, const ChatRequest& request);
const char* chat_format_name(ChatTemplate format);

}  // namespace helios
