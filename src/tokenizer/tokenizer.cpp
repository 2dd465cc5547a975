// Tokenizer: construction and checks, decoding, end-of-generation, and the streaming decoder.
// The encoders themselves live in bpe_tokenizer.cpp and spm_tokenizer.cpp; chat prompts in
// src/chat/.

#include "helios/tokenizer.h"

#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace helios {

namespace {

Status check_token_id(const char* what, TokenId id, size_t n_vocab) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n_vocab)) {
    return invalid_argument(std::string("tokenizer: ") + what + " token id " + std::to_string(id) +
                            " is outside the vocabulary of " + std::to_string(n_vocab) +
                            " tokens");
  }
  return ok_status();
}

Status check_spec(const TokenizerSpec& spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return invalid_argument("tokenizer: the vocabulary is empty");
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.scores.size()) + " scores for " +
                            std::to_string(n) + " tokens");
  }
  if (!spec.kinds.empty() && spec.kinds.size() != n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.kinds.size()) +
                            " token kinds for " + std::to_string(n) + " tokens");
  }
  for (size_t i = 0; i < spec.kinds.size(); ++i) {
    const auto kind = static_cast<int32_t>(spec.kinds[i]);
    if (kind < 0 || kind > static_cast<int32_t>(TokenKind::kByte)) {
      return invalid_argument("tokenizer: token " + std::to_string(i) + " has unknown kind " +
                              std::to_string(kind) + " (expected 0..6)");
    }
  }
  HELIOS_RETURN_IF_ERROR(check_token_id("BOS", spec.bos_id, n));
  HELIOS_RETURN_IF_ERROR(check_token_id("EOS", spec.eos_id, n));
  HELIOS_RETURN_IF_ERROR(check_token_id("unknown", spec.unk_id, n));
  HELIOS_RETURN_IF_ERROR(check_token_id("end-of-turn", spec.eot_id, n));
  if (spec.add_bos && spec.bos_id < 0) {
    return invalid_argument("tokenizer: add_bos is set but there is no BOS token");
  }
  if (spec.add_eos && spec.eos_id < 0) {
    return invalid_argument("tokenizer: add_eos is set but there is no EOS token");
  }
  return ok_status();
}

// llama.cpp makes end-of-turn and fill-in-the-middle tokens (<|im_end|>, <|fim_prefix|>, ...)
// control tokens even when the file says otherwise, so that they are neither matched in plain
// text nor printed.
void mark_end_of_turn_tokens_control(TokenizerSpec* spec) {
  for (size_t i = 0; i < spec->tokens.size(); ++i) {
    if (!is_end_of_turn_text(spec->tokens[i]) && !is_fim_marker_text(spec->tokens[i])) continue;
    if (spec->kinds.empty()) spec->kinds.assign(spec->tokens.size(), TokenKind::kNormal);
    spec->kinds[i] = TokenKind::kControl;
  }
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::create(TokenizerSpec spec) {
  HELIOS_RETURN_IF_ERROR(check_spec(spec));
  mark_end_of_turn_tokens_control(&spec);
  switch (spec.model) {
    case TokenizerModel::kByteLevelBpe:
      return make_bpe_tokenizer(std::move(spec));
    case TokenizerModel::kSentencePiece:
      return make_spm_tokenizer(std::move(spec));
  }
  return invalid_argument("tokenizer: unknown tokenizer model");
}

// Matches llama_detokenize(remove_special=false, unparse_special=render_special): pieces are
// concatenated, and with a space prefix the first token loses one leading space (the one
// encode added). A leading BOS takes that turn, so text after BOS keeps its space, as in
// llama.cpp. Unlike llama.cpp, no clean-up of spaces before punctuation is done for GPT-2-style
// models (SmolLM2 does not use it), so decode() equals the concatenated StreamDecoder output.
std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool render_special) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], render_special);
    if (i == 0 && spec_.add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    text += piece;
  }
  return text;
}

const std::vector<std::string>& Tokenizer::pieces() const {
  std::call_once(pieces_once_, [this] {
    pieces_.reserve(n_vocab());
    for (TokenId id = 0; id < n_vocab(); ++id) pieces_.push_back(token_to_piece(id, /*render_special=*/false));
  });
  return pieces_;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return false;
  if (id == spec_.eos_id || id == spec_.eot_id) return true;
  const std::string& text = spec_.tokens[id];
  return is_control(id) && (is_end_of_turn_text(text) || is_fim_end_of_generation_text(text));
}

bool Tokenizer::is_control(TokenId id) const {
  return token_kind(spec_, id) == TokenKind::kControl;
}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tokenizer_.token_to_piece(id, /*render_special=*/false);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const unicode::Utf8Scan scan = unicode::scan_strict(pending_, pos);
    if (scan.state == unicode::Utf8State::kTruncated) break;  // the next token may complete it
    if (scan.state == unicode::Utf8State::kComplete) {
      out.append(pending_, pos, scan.length);
    } else {
      unicode::append_utf8(unicode::kReplacementChar, &out);
    }
    pos += scan.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = unicode::sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

std::string valid_utf8(std::string_view text) { return unicode::sanitize_utf8(text); }

}  // namespace helios
