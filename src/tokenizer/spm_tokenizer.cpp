// SentencePiece-style BPE (llama2.c, Llama 2), following llama.cpp's llm_tokenizer_spm: spaces
// become "▁", adjacent symbols merge greedily by the score of the merged piece, and characters
// no piece covers fall back to <0xNN> byte tokens.

#include <optional>
#include <string_view>
#include <utility>

#include "tokenizer/symbol_merge.h"
#include "tokenizer/vocab.h"

namespace helios {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK "▁"

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0;;) {
    const size_t hit = text.find(from, pos);
    const size_t n = hit == std::string_view::npos ? std::string_view::npos : hit - pos;
    out.append(text.substr(pos, n));
    if (hit == std::string_view::npos) return out;
    out.append(to);
    pos = hit + from.size();
  }
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(TokenizerSpec spec)
      : Tokenizer(std::move(spec)), index_(build_token_index(spec_)), splitter_(spec_) {}

  std::vector<TokenId> encode_impl(const std::string& text, bool add_special, bool parse_special,
                                   const ByteRanges* special_ranges) const override;
  std::string token_to_piece(TokenId id, bool render_special) const override;

 private:
  void encode_text(const std::string& text, std::vector<TokenId>* out) const;
  void emit_bytes(std::string_view bytes, std::vector<TokenId>* out) const;

  TokenIndex index_;
  SpecialTokenSplitter splitter_;
};

std::vector<TokenId> SpmTokenizer::encode_impl(const std::string& text, bool add_special,
                                               bool parse_special, const ByteRanges* special_ranges) const {
  std::vector<TokenId> out;
  if (add_special && spec_.add_bos) out.push_back(spec_.bos_id);
  // llama.cpp prefixes the space to every text fragment that starts the input or follows a
  // special token, not only to the first one.
  bool after_special = true;
  for (const Fragment& fragment : splitter_.split(text, parse_special, special_ranges)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      after_special = true;
      continue;
    }
    std::string piece = spec_.add_space_prefix && after_special ? " " : "";
    piece.append(fragment.text);
    encode_text(replace_all(piece, " ", kSpaceMark), &out);
    after_special = false;
  }
  if (add_special && spec_.add_eos) out.push_back(spec_.eos_id);
  return out;
}

void SpmTokenizer::encode_text(const std::string& text, std::vector<TokenId>* out) const {
  // Two symbols merge when their concatenation is a piece, the piece with the highest score
  // first. Malformed bytes end up in a symbol no piece covers, and leave as byte tokens.
  const auto score = [this](std::string_view left,
                            std::string_view right) -> std::optional<double> {
    // `right` follows `left` in the text, so the merged piece is the view over both.
    const TokenId id = find_token(index_, std::string(left.data(), left.size() + right.size()));
    if (id < 0) return std::nullopt;
    return spec_.scores.empty() ? 0.0f : spec_.scores[id];
  };
  for (std::string_view symbol : merge_symbols(text, score)) {
    const std::string piece(symbol);
    if (const TokenId id = find_token(index_, piece); id >= 0) {
      out->push_back(id);
    } else {
      emit_bytes(piece, out);
    }
  }
}

// Byte fallback: <0xNN>, else a token that is the byte itself, else unk (llama.cpp would throw
// here; a vocabulary without byte tokens loses the character instead when it has no unk).
void SpmTokenizer::emit_bytes(std::string_view bytes, std::vector<TokenId>* out) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    const std::string name = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    TokenId id = find_token(index_, name);
    if (id < 0) id = find_token(index_, std::string(1, c));
    if (id < 0) id = spec_.unk_id;
    if (id >= 0) out->push_back(id);
  }
}

std::string SpmTokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= spec_.tokens.size()) return {};
  const std::string& text = spec_.tokens[id];
  switch (token_kind(spec_, id)) {
    case TokenKind::kControl:
    case TokenKind::kUnknown:
      return render_special ? text : std::string();
    case TokenKind::kUserDefined:
      return text;
    case TokenKind::kByte:
      if (const int byte = byte_token_value(text); byte >= 0) {
        return std::string(1, static_cast<char>(byte));
      }
      return replace_all(text, kSpaceMark, " ");
    case TokenKind::kNormal:
      return replace_all(text, kSpaceMark, " ");
    case TokenKind::kUndefined:
    case TokenKind::kUnused:
      break;
  }
  return {};
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec) {
  return std::make_unique<SpmTokenizer>(std::move(spec));
}

}  // namespace helios
