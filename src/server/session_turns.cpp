#include "server/session_turns.h"

#include <algorithm>
#include <cstdio>

namespace helios::server {
namespace {

// Bytes [from, to) of the prompt's text, as segments with their origin.
void append_slice(const ChatPrompt& prompt, size_t from, size_t to, std::vector<ChatSegment>* out) {
  size_t at = 0;
  for (const ChatSegment& s : prompt.segments) {
    const size_t begin = std::max(at, from), end = std::min(at + s.text.size(), to);
    if (begin < end) {
      std::string piece = s.text.substr(begin - at, end - begin);
      if (!out->empty() && out->back().from_template == s.from_template) out->back().text += piece;
      else out->push_back({std::move(piece), s.from_template});
    }
    at += s.text.size();
  }
}

void rstrip(std::string* s) {
  while (!s->empty() && (s->back() == ' ' || s->back() == '\n' || s->back() == '\t' || s->back() == '\r')) s->pop_back();
}

}  // namespace

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

SessionTurns::SessionTurns(const Tokenizer& tokenizer, std::optional<ChatRequest> conversation,
                           std::string tool_call_open)
    : tokenizer_(tokenizer), conversation_(std::move(conversation)), tool_call_open_(std::move(tool_call_open)) {}

const std::vector<ChatMessage>& SessionTurns::messages() const {
  static const std::vector<ChatMessage> kNone;
  return conversation_ ? conversation_->messages : kNone;
}

ChatMessage SessionTurns::assistant_message(bool raw, const std::string& call_id) const {
  ChatMessage m("assistant", assistant_text_);
  const InterceptEvent& e = *event_;
  if (raw) return m;
  if (e.trigger == "tool_call" && e.parse_error.empty() && !e.tool_name.empty()) {
    // The text before the call is the turn's content; the call itself goes in tool_calls, which the
    // template writes back as its own markup.
    const size_t open = tool_call_open_.empty() ? std::string::npos : assistant_text_.rfind(tool_call_open_);
    m.content = open == std::string::npos ? std::string() : assistant_text_.substr(0, open);
    rstrip(&m.content);
    const std::string arguments = e.arguments_json.empty() ? "{}" : e.arguments_json;
    m.tool_calls_json = "[{" + (call_id.empty() ? std::string() : "\"id\": " + json_quote(call_id) + ", ") +
                        "\"type\": \"function\", \"function\": {\"name\": " + json_quote(e.tool_name) +
                        ", \"arguments\": " + arguments + "}}]";
  } else if (e.trigger == "end_of_turn" && !e.matched.empty() && assistant_text_.size() >= e.matched.size() &&
             assistant_text_.compare(assistant_text_.size() - e.matched.size(), e.matched.size(), e.matched) == 0) {
    // The end-of-turn token is the template's to write, not the content's.
    m.content.resize(assistant_text_.size() - e.matched.size());
  }
  return m;
}

StatusOr<std::vector<TokenId>> SessionTurns::resume(const ResumeInput& input) {
  if (!event_) return failed_precondition("the session is not paused: a resume answers an intercept");
  switch (input.kind) {
    case ResumeInput::Kind::kText: {
      if (input.text.empty()) return invalid_argument("resume.text is empty");
      std::vector<TokenId> ids = tokenizer_.encode(input.text, /*add_special=*/false, /*parse_special=*/false);
      if (ids.empty()) return invalid_argument("resume.text gives no tokens");
      assistant_text_ += input.text;  // the assistant's turn goes on around it
      event_.reset();
      return ids;
    }
    case ResumeInput::Kind::kTokenIds: {
      if (input.token_ids.empty()) return invalid_argument("resume.token_ids is empty");
      for (size_t i = 0; i < input.token_ids.size(); ++i) {
        const TokenId id = input.token_ids[i];
        if (id < 0 || id >= tokenizer_.n_vocab()) {
          return invalid_argument("resume.token_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                                  " is outside the vocabulary (0.." + std::to_string(tokenizer_.n_vocab() - 1) + ")");
        }
      }
      assistant_text_ += tokenizer_.decode(input.token_ids);
      event_.reset();
      return input.token_ids;
    }
    case ResumeInput::Kind::kToolResult:
    case ResumeInput::Kind::kUserTurn:
      break;
  }
  const bool tool = input.kind == ResumeInput::Kind::kToolResult;
  const char* field = tool ? "resume.tool_result" : "resume.user_turn";
  if (!conversation_) {
    return invalid_argument(std::string(field) +
                            " needs a session opened with a conversation (or chat text); "
                            "send `text` (or `token_ids`) instead");
  }
  if (!tool && input.text.empty()) return invalid_argument("resume.user_turn is empty");
  const InterceptEvent& e = *event_;
  const ChatFormatter formatter(tokenizer_);
  auto render = [&](std::vector<ChatMessage> messages, bool generation_prompt) {
    ChatRequest r;
    r.messages = std::move(messages);
    r.tools_json = conversation_->tools_json;
    r.add_generation_prompt = generation_prompt;
    return formatter.format(r);
  };
  // The earlier turns alone: where the paused assistant turn starts in A.
  HELIOS_ASSIGN_OR_RETURN(ChatPrompt before, render(conversation_->messages, false));
  const std::string before_text = before.text();

  // A, and where in it the trigger's text was written.
  std::vector<ChatMessage> messages = conversation_->messages;
  messages.push_back(assistant_message(false, input.tool_call_id));
  HELIOS_ASSIGN_OR_RETURN(ChatPrompt a, render(messages, false));
  std::string a_text = a.text();
  auto trigger_end = [&](const std::string& text) -> std::optional<size_t> {
    const size_t from = text.compare(0, before_text.size(), before_text) == 0 ? before_text.size() : 0;
    if (e.matched.empty()) return std::nullopt;
    const size_t at = text.rfind(e.matched);
    if (at == std::string::npos || at < from) return std::nullopt;
    return at + e.matched.size();
  };
  std::optional<size_t> closing_from = trigger_end(a_text);
  if (!closing_from && e.trigger == "tool_call" && !messages.back().tool_calls_json.empty()) {
    // A template that does not write tool calls (SmolLM2's, say): the turn as the model wrote it.
    messages.back() = assistant_message(true, "");
    HELIOS_ASSIGN_OR_RETURN(a, render(messages, false));
    a_text = a.text();
    closing_from = trigger_end(a_text);
  }

  // B: A's turns and the new one.
  ChatMessage turn(tool ? "tool" : "user", input.text);
  if (tool) {
    turn.name = input.name.empty() ? e.tool_name : input.name;
    turn.tool_call_id = input.tool_call_id;
  }
  std::vector<ChatMessage> with_turn = messages;
  with_turn.push_back(turn);
  HELIOS_ASSIGN_OR_RETURN(ChatPrompt b, render(with_turn, true));
  const std::string b_text = b.text();
  if (b_text.size() < a_text.size() || b_text.compare(0, a_text.size(), a_text) != 0) {
    return failed_precondition(
        "the chat template renders earlier turns differently once a turn is added; resume with `text` instead");
  }

  std::vector<ChatSegment> delta;
  append_slice(a, closing_from.value_or(a_text.size()), a_text.size(), &delta);
  append_slice(b, a_text.size(), b_text.size(), &delta);
  std::string text;
  ByteRanges template_ranges;
  for (const ChatSegment& s : delta) {
    if (s.from_template) template_ranges.emplace_back(text.size(), text.size() + s.text.size());
    text += s.text;
  }
  std::vector<TokenId> ids = tokenizer_.encode_with_special_ranges(text, /*add_special=*/false, template_ranges);
  if (ids.empty()) return invalid_argument(std::string(field) + " gives no tokens");

  conversation_->messages = std::move(with_turn);
  assistant_text_.clear();
  event_.reset();
  return ids;
}

}  // namespace helios::server
