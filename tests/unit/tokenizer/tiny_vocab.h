// Small vocabularies built in code for the tokenizer tests.
#pragma once

#include <string>
#include <vector>

#include "helios/tokenizer.h"
#include "tokenizer/unicode.h"

namespace helios::testing {

// Byte-level BPE whose ids 0..255 are the 256 byte characters (id == byte), followed by `extra`
// tokens (byte-mapped text, e.g. "Ġworld") of the given kinds (kNormal when `extra_kinds` is
// empty).
inline TokenizerSpec byte_level_spec(const std::vector<std::string>& extra,
                                     const std::vector<std::string>& merges,
                                     const std::vector<TokenKind>& extra_kinds = {}) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kByteLevelBpe;
  spec.pre = PreTokenizer::kGpt2;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(unicode::byte_to_char(static_cast<uint8_t>(b)));
  spec.kinds.assign(256, TokenKind::kNormal);
  for (size_t i = 0; i < extra.size(); ++i) {
    spec.tokens.push_back(extra[i]);
    spec.kinds.push_back(extra_kinds.empty() ? TokenKind::kNormal : extra_kinds[i]);
  }
  spec.merges = merges;
  return spec;
}

// SentencePiece vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF> (id = 3 + byte), then
// `pieces` with `scores` (ids from 259).
constexpr TokenId kSpmFirstPiece = 259;
inline TokenId spm_byte(uint8_t byte) { return 3 + byte; }

inline TokenizerSpec spm_spec(const std::vector<std::string>& pieces,
                              const std::vector<float>& scores, bool with_bytes = true) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kSentencePiece;
  spec.tokens = {"<unk>", "<s>", "</s>"};
  spec.kinds = {TokenKind::kUnknown, TokenKind::kControl, TokenKind::kControl};
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    // Without byte tokens the slots still exist (ids stay stable) but are unused.
    spec.tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    spec.kinds.push_back(with_bytes ? TokenKind::kByte : TokenKind::kUnused);
  }
  if (!with_bytes) {
    for (int b = 0; b < 256; ++b) spec.tokens[3 + b] = "<unused" + std::to_string(b) + ">";
  }
  spec.scores.assign(spec.tokens.size(), 0.0f);
  for (size_t i = 0; i < pieces.size(); ++i) {
    spec.tokens.push_back(pieces[i]);
    spec.kinds.push_back(TokenKind::kNormal);
    spec.scores.push_back(scores[i]);
  }
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.unk_id = 0;
  spec.add_space_prefix = true;
  return spec;
}

}  // namespace helios::testing
