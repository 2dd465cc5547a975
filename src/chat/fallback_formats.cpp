// The chat formats recognised from a template's markers, written directly: what a prompt falls
// back to when the model's template cannot be run. Markers are template text; roles and contents
// come from the conversation.
#include "chat/text_ops.h"
#include "helios/chat_template.h"

namespace helios {
namespace {

class PromptBuilder {
 public:
  PromptBuilder& markup(const std::string& text) { return add(text, true); }
  PromptBuilder& content(const std::string& text) { return add(text, false); }
  ChatPrompt take() { return std::move(prompt_); }

 private:
  PromptBuilder& add(const std::string& text, bool from_template) {
    if (text.empty()) return *this;
    auto& segments = prompt_.segments;
    if (!segments.empty() && segments.back().from_template == from_template) segments.back().text += text;
    else segments.push_back({text, from_template});
    return *this;
  }
  ChatPrompt prompt_;
};

// As SmolLM2's template: a default system turn only when the template has one and the
// conversation does not start with its own.
ChatPrompt chatml(const ChatRequest& r, const std::string& default_system) {
  PromptBuilder b;
  if (!r.messages.empty() && r.messages[0].role != "system" && !default_system.empty()) {
    b.markup("<|im_start|>system\n" + default_system + "<|im_end|>\n");
  }
  for (const ChatMessage& m : r.messages) {
    b.markup("<|im_start|>").content(m.role).markup("\n").content(m.content).markup("<|im_end|>\n");
  }
  if (r.add_generation_prompt) b.markup("<|im_start|>assistant\n");
  return b.take();
}

// llama.cpp's "llama2-sys" rendering; BOS comes from the tokenizer.
ChatPrompt llama2(const ChatRequest& r) {
  PromptBuilder b;
  b.markup("[INST] ");
  bool inside_turn = true;
  for (const ChatMessage& m : r.messages) {
    if (!inside_turn) {
      b.markup("[INST] ");
      inside_turn = true;
    }
    if (m.role == "system") {
      b.markup("<<SYS>>\n").content(m.content).markup("\n<</SYS>>\n\n");
    } else if (m.role == "user") {
      b.content(m.content).markup(" [/INST]");
    } else {
      b.content(m.content).markup("</s>");
      inside_turn = false;
    }
  }
  return b.take();
}

ChatPrompt llama3(const ChatRequest& r) {
  PromptBuilder b;
  for (const ChatMessage& m : r.messages) {
    const std::string trimmed =
        jinja::text::strip(jinja::Text::literal(m.content), jinja::text::Side::kBoth, nullptr).bytes();
    b.markup("<|start_header_id|>").content(m.role).markup("<|end_header_id|>\n\n").content(trimmed).markup("<|eot_id|>");
  }
  if (r.add_generation_prompt) b.markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return b.take();
}

}  // namespace

const char* chat_format_name(ChatTemplate format) {
  switch (format) {
    case ChatTemplate::kChatML: return "ChatML";
    case ChatTemplate::kLlama2: return "Llama 2";
    case ChatTemplate::kLlama3: return "Llama 3";
    case ChatTemplate::kNone: break;
  }
  return "plain text (no chat format)";
}

ChatPrompt format_recognised_chat(const TokenizerSpec& spec, const ChatRequest& request) {
  switch (spec.chat) {
    case ChatTemplate::kChatML: return chatml(request, spec.chat_default_system);
    case ChatTemplate::kLlama2: return llama2(request);
    case ChatTemplate::kLlama3: return llama3(request);
    case ChatTemplate::kNone: break;
  }
  PromptBuilder b;
  for (const ChatMessage& m : request.messages) b.content(m.content);
  return b.take();
}

}  // namespace helios
