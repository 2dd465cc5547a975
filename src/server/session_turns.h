// What a session's resume appends to the paused generation's context, as tokens. No RPC state:
// the session handler (session.cpp) feeds it the generated text and each pause, and asks it for
// the tokens of each resume.
//
// Plain input (text, token ids) is appended as is. A tool result or the next human turn, in a
// session opened with a conversation, is rendered with the model's chat template: the session
// keeps the conversation's message list (then, per segment, the assistant message the segment
// generated, and each turn the client added), renders A = the messages up to and including the
// paused assistant turn (no generation prompt) and B = A's messages and the new turn (with the
// generation prompt), and appends
//     closing + B[len(A):]
// where `closing` is what A writes after the pause's trigger in that assistant turn (the
// template's "<|im_end|>\n" after a "</tool_call>", say). The generated tokens stay as they are
// in the context: only the template's text after them is added, so the context reads as the
// template would have rendered the whole conversation. It is tokenized as ChatFormatter::encode
// tokenizes a prompt: the template's text may spell control tokens, the turn's content may not;
// no BOS.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "helios/chat_template.h"
#include "helios/intercept.h"
#include "helios/status.h"
#include "helios/tokenizer.h"

namespace helios::server {

// One resume's input (SessionResume without its proto).
struct ResumeInput {
  enum class Kind { kText, kTokenIds, kToolResult, kUserTurn };
  Kind kind = Kind::kText;
  std::string text;              // kText; kToolResult: the tool's output; kUserTurn: the turn
  std::vector<TokenId> token_ids;  // kTokenIds
  std::string name;              // kToolResult: the tool ("" = the call's)
  std::string tool_call_id;      // kToolResult: the call answered ("" = one the session makes)
};

class SessionTurns {
 public:
  // `conversation`: the session's conversation (its messages and tools) when it was opened with
  // one; nullopt for a text or token prompt (then only plain resumes are possible).
  // `tool_call_open`: the tool-call markup's open (InterceptTriggers::tool_call_open).
  SessionTurns(const Tokenizer& tokenizer, std::optional<ChatRequest> conversation,
               std::string tool_call_open = kToolCallOpen);

  bool has_conversation() const { return conversation_.has_value(); }

  // Text the generation released (the tokens' text, in order).
  void add_generated(const std::string& text) { assistant_text_ += text; }
  // The generation paused.
  void on_pause(const InterceptEvent& event) { event_ = event; }

  // The tokens to append for `input` after the last pause; on success the session's message
  // list takes the turn. INVALID_ARGUMENT for empty input, a token outside the vocabulary, or a
  // tool result / user turn in a session without a conversation; FAILED_PRECONDITION when there
  // was no pause, or the template renders the earlier turns differently once the turn is added;
  // the template's own errors as ChatFormatter::format gives them.
  StatusOr<std::vector<TokenId>> resume(const ResumeInput& input);

  // The session's messages so far (the conversation, then each segment's assistant message and
  // each added turn); empty without a conversation. The open assistant turn is not in it.
  const std::vector<ChatMessage>& messages() const;
  // The text of the assistant turn still open: generated since the last tool result or user turn
  // (plain resumes in between included).
  const std::string& assistant_text() const { return assistant_text_; }

 private:
  // The assistant message of the turn that paused: structured (a tool call's content and
  // tool_calls_json, the call's id `call_id` when not "") unless `raw`.
  ChatMessage assistant_message(bool raw, const std::string& call_id) const;

  const Tokenizer& tokenizer_;
  std::optional<ChatRequest> conversation_;  // its messages grow turn by turn
  std::string tool_call_open_;
  std::string assistant_text_;
  std::optional<InterceptEvent> event_;  // the last pause, until a resume answers it
};

// `s` as a JSON string literal (quotes included).
std::string json_quote(const std::string& s);

}  // namespace helios::server
