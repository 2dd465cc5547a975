// tokenizer.ggml.* metadata -> TokenizerSpec, with llama.cpp's defaults for absent keys
// (llama_vocab::impl::load) and checks that name the offending key.

#include <string_view>

#include "helios/gguf.h"
#include "helios/tokenizer.h"
#include "tokenizer/vocab.h"

namespace helios {

namespace {

constexpr char kModelKey[] = "tokenizer.ggml.model";
constexpr char kPreKey[] = "tokenizer.ggml.pre";
constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kScoresKey[] = "tokenizer.ggml.scores";
constexpr char kTypesKey[] = "tokenizer.ggml.token_type";
constexpr char kMergesKey[] = "tokenizer.ggml.merges";
constexpr char kTemplateKey[] = "tokenizer.chat_template";

std::string where(const GgufFile& file, const std::string& key) {
  return file.path() + ": " + key;
}

// Picks the split pattern; Llama 3's own names also skip merges for whole-token words and add
// BOS by default, as llama.cpp does (smaug-bpe and dbrx share only the pattern).
Status read_pre_tokenizer(const GgufFile& file, TokenizerSpec* spec) {
  std::string name;
  if (file.find(kPreKey)) {
    HELIOS_ASSIGN_OR_RETURN(name, file.get_string(kPreKey));
  }
  if (name.empty() || is_one_of(name, {"default", "gpt-2", "phi-2", "mpt", "olmo"})) {
    spec->pre = PreTokenizer::kGpt2;
  } else if (is_one_of(name, {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone",
                              "minerva-7b"})) {
    spec->pre = PreTokenizer::kSmolLM;
  } else if (is_one_of(name, {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})) {
    spec->pre = PreTokenizer::kLlama3;
    spec->ignore_merges = true;
    spec->add_bos = true;
  } else if (is_one_of(name, {"smaug-bpe", "dbrx"})) {
    spec->pre = PreTokenizer::kLlama3;
  } else if (is_one_of(name, {"qwen2", "deepseek-r1-qwen"})) {
    spec->pre = PreTokenizer::kQwen2;  // merges apply to every word; no BOS unless the file says
  } else {
    return invalid_argument(where(file, kPreKey) + " = '" + name +
                            "' is not supported; supported: gpt-2, default, phi-2, mpt, olmo "
                            "(GPT-2 split), smollm, starcoder, refact, codeshell, command-r, "
                            "exaone, minerva-7b (digits apart), llama3, llama-v3, llama-bpe, "
                            "falcon3, pixtral, smaug-bpe, dbrx (Llama 3 split), qwen2, "
                            "deepseek-r1-qwen (Qwen2 split)");
  }
  return ok_status();
}

// Model kind and the defaults that go with it; keys read later override them.
Status read_model(const GgufFile& file, TokenizerSpec* spec) {
  if (!file.find(kModelKey)) return not_found(where(file, kModelKey) + " is missing");
  HELIOS_ASSIGN_OR_RETURN(std::string model, file.get_string(kModelKey));
  if (model == "llama") {
    spec->model = TokenizerModel::kSentencePiece;
    spec->bos_id = 1;  // llama.cpp's defaults when the ids are absent
    spec->eos_id = 2;
    spec->unk_id = 0;
    spec->add_bos = true;
    spec->add_space_prefix = true;
    return ok_status();
  }
  if (model == "gpt2") {
    spec->model = TokenizerModel::kByteLevelBpe;
    return read_pre_tokenizer(file, spec);
  }
  return invalid_argument(where(file, kModelKey) + " = '" + model +
                          "' is not supported; supported: gpt2 (byte-level BPE), "
                          "llama (SentencePiece BPE)");
}

Status read_vocabulary(const GgufFile& file, TokenizerSpec* spec) {
  const auto* tokens = file.get_string_array(kTokensKey);
  if (!tokens) {
    if (!file.find(kTokensKey)) return not_found(where(file, kTokensKey) + " is missing");
    return invalid_argument(where(file, kTokensKey) + " is not an array of strings");
  }
  if (tokens->empty()) return invalid_argument(where(file, kTokensKey) + " is empty");
  spec->tokens = *tokens;
  const size_t n = tokens->size();
  const auto size_error = [&](const char* key, size_t size) {
    return invalid_argument(where(file, key) + " has " + std::to_string(size) + " entries but " +
                            kTokensKey + " has " + std::to_string(n));
  };

  if (file.find(kScoresKey)) {
    const auto* scores = file.get_float_array(kScoresKey);
    if (!scores) return invalid_argument(where(file, kScoresKey) + " is not an array of floats");
    if (scores->size() != n) return size_error(kScoresKey, scores->size());
    spec->scores.assign(scores->begin(), scores->end());
  }
  if (file.find(kTypesKey)) {
    const auto* types = file.get_int_array(kTypesKey);
    if (!types) return invalid_argument(where(file, kTypesKey) + " is not an array of integers");
    if (types->size() != n) return size_error(kTypesKey, types->size());
    spec->kinds.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t type = (*types)[i];
      if (type < 0 || type > static_cast<int64_t>(TokenKind::kByte)) {
        return invalid_argument(where(file, kTypesKey) + "[" + std::to_string(i) + "] = " +
                                std::to_string(type) + " is not a token type (0..6)");
      }
      spec->kinds.push_back(static_cast<TokenKind>(type));
    }
  }
  if (spec->model == TokenizerModel::kByteLevelBpe) {
    const auto* merges = file.get_string_array(kMergesKey);
    if (!merges) {
      if (!file.find(kMergesKey)) return not_found(where(file, kMergesKey) + " is missing");
      return invalid_argument(where(file, kMergesKey) + " is not an array of strings");
    }
    spec->merges = *merges;
  }
  return ok_status();
}

Status read_token_id(const GgufFile& file, const std::string& key, TokenizerSpec* spec,
                     TokenId* id) {
  if (!file.find(key)) {
    // A default that does not fit the vocabulary is dropped, as llama.cpp does.
    if (*id >= static_cast<TokenId>(spec->tokens.size())) *id = -1;
    return ok_status();
  }
  HELIOS_ASSIGN_OR_RETURN(uint64_t value, file.get_uint(key));
  if (value >= spec->tokens.size()) {
    return invalid_argument(where(file, key) + " = " + std::to_string(value) +
                            " is outside the vocabulary of " + std::to_string(spec->tokens.size()) +
                            " tokens");
  }
  *id = static_cast<TokenId>(value);
  return ok_status();
}

Status read_flag(const GgufFile& file, const std::string& key, bool* flag) {
  if (!file.find(key)) return ok_status();
  HELIOS_ASSIGN_OR_RETURN(*flag, file.get_bool(key));
  return ok_status();
}

Status read_special_tokens(const GgufFile& file, TokenizerSpec* spec) {
  HELIOS_RETURN_IF_ERROR(read_token_id(file, "tokenizer.ggml.bos_token_id", spec, &spec->bos_id));
  HELIOS_RETURN_IF_ERROR(read_token_id(file, "tokenizer.ggml.eos_token_id", spec, &spec->eos_id));
  HELIOS_RETURN_IF_ERROR(
      read_token_id(file, "tokenizer.ggml.unknown_token_id", spec, &spec->unk_id));
  HELIOS_RETURN_IF_ERROR(read_token_id(file, "tokenizer.ggml.eot_token_id", spec, &spec->eot_id));
  if (spec->eot_id < 0) {
    // No key: the first end-of-turn-looking token, as llama.cpp guesses it.
    const TokenIndex index = build_token_index(*spec);
    for (const std::string& text : end_of_turn_texts()) {
      if (const TokenId id = find_token(index, text); id >= 0) {
        spec->eot_id = id;
        break;
      }
    }
  }
  HELIOS_RETURN_IF_ERROR(read_flag(file, "tokenizer.ggml.add_bos_token", &spec->add_bos));
  HELIOS_RETURN_IF_ERROR(read_flag(file, "tokenizer.ggml.add_eos_token", &spec->add_eos));
  HELIOS_RETURN_IF_ERROR(
      read_flag(file, "tokenizer.ggml.add_space_prefix", &spec->add_space_prefix));
  if (spec->add_bos && spec->bos_id < 0) {
    return invalid_argument(file.path() + ": the tokenizer adds BOS but " +
                            "tokenizer.ggml.bos_token_id is missing");
  }
  if (spec->add_eos && spec->eos_id < 0) {
    return invalid_argument(file.path() + ": the tokenizer adds EOS but " +
                            "tokenizer.ggml.eos_token_id is missing");
  }
  return ok_status();
}

ChatTemplate chat_from_markers(const std::string& text) {
  if (text.find("<|im_start|>") != std::string::npos) return ChatTemplate::kChatML;
  if (text.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::kLlama3;
  if (text.find("[INST]") != std::string::npos) return ChatTemplate::kLlama2;
  return ChatTemplate::kNone;
}

ChatTemplate chat_from_vocabulary(const TokenizerSpec& spec) {
  const TokenIndex index = build_token_index(spec);
  if (find_token(index, "<|im_start|>") >= 0) return ChatTemplate::kChatML;
  if (find_token(index, "<|start_header_id|>") >= 0) return ChatTemplate::kLlama3;
  if (find_token(index, "[INST]") >= 0) return ChatTemplate::kLlama2;
  return ChatTemplate::kNone;
}

// The system prompt a ChatML template writes when the conversation has none: a literal
// "<|im_start|>system\n...<|im_end|>" in a template that tests the first role (SmolLM2's
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
std::string default_system_prompt(const std::string& tmpl) {
  for (std::string_view opener : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    const size_t start = tmpl.find(opener);
    if (start == std::string::npos) continue;
    const size_t begin = start + opener.size();
    const size_t end = tmpl.find("<|im_end|>", begin);
    if (end == std::string::npos) continue;
    std::string literal = tmpl.substr(begin, end - begin);
    // Anything template-like means the text is computed (message content), not a default.
    if (literal.empty() || literal.find_first_of("'\"{}+") != std::string::npos) continue;
    if (tmpl.find("'system'") == std::string::npos &&
        tmpl.find("\"system\"") == std::string::npos) {
      continue;
    }
    return literal;
  }
  return {};
}

Status read_chat_template(const GgufFile& file, TokenizerSpec* spec) {
  if (!file.find(kTemplateKey)) {
    spec->chat = chat_from_vocabulary(*spec);
    return ok_status();
  }
  HELIOS_ASSIGN_OR_RETURN(std::string tmpl, file.get_string(kTemplateKey));
  spec->chat = chat_from_markers(tmpl);
  if (spec->chat == ChatTemplate::kChatML) spec->chat_default_system = default_system_prompt(tmpl);
  spec->chat_template = std::move(tmpl);
  return ok_status();
}

}  // namespace

StatusOr<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& file) {
  TokenizerSpec spec;
  HELIOS_RETURN_IF_ERROR(read_model(file, &spec));
  HELIOS_RETURN_IF_ERROR(read_vocabulary(file, &spec));
  HELIOS_RETURN_IF_ERROR(read_special_tokens(file, &spec));
  HELIOS_RETURN_IF_ERROR(read_chat_template(file, &spec));
  return spec;
}

}  // namespace helios
