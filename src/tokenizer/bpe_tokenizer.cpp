// Byte-level BPE (GPT-2 family: SmolLM2, Llama 3), following llama.cpp's llm_tokenizer_bpe:
// special tokens are cut out first, each remaining fragment is pre-tokenized into words, each
// word is byte-mapped and merged pair by pair, lowest merge rank first.

#include <functional>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "tokenizer/pretokenize.h"
#include "tokenizer/symbol_merge.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace helios {

namespace {

using MergeKey = std::pair<std::string, std::string>;
using MergeView = std::pair<std::string_view, std::string_view>;

// Lets the rank table be probed with views of the symbols, without building strings.
struct MergeHash {
  using is_transparent = void;
  size_t operator()(const MergeView& k) const {
    const size_t h = std::hash<std::string_view>{}(k.first);
    const size_t g = std::hash<std::string_view>{}(k.second);
    return h ^ (g + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  }
  size_t operator()(const MergeKey& k) const { return (*this)(MergeView(k.first, k.second)); }
};
struct MergeEqual {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return a.first == b.first && a.second == b.second;
  }
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec);
  std::vector<TokenId> encode_impl(const std::string& text, bool add_special, bool parse_special,
                                   const ByteRanges* special_ranges) const override;
  std::string token_to_piece(TokenId id, bool render_special) const override;

 private:
  void encode_word(const std::string& word, std::vector<TokenId>* out) const;
  void emit_symbol(std::string_view symbol, std::vector<TokenId>* out) const;
  std::string piece_of(TokenId id) const;

  TokenIndex index_;
  std::unordered_map<MergeKey, int, MergeHash, MergeEqual> ranks_;
  SpecialTokenSplitter splitter_;
  std::vector<std::string> pieces_;  // id -> bytes, control tokens included
};

BpeTokenizer::BpeTokenizer(TokenizerSpec spec)
    : Tokenizer(std::move(spec)), index_(build_token_index(spec_)), splitter_(spec_) {
  ranks_.reserve(spec_.merges.size());
  for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const std::string& merge = spec_.merges[rank];
    // Split at the first space after the first byte, as llama.cpp does; a line without one
    // names no pair and is skipped. emplace keeps the first (best) rank of a repeated pair.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    ranks_.emplace(MergeKey(merge.substr(0, space), merge.substr(space + 1)),
                   static_cast<int>(rank));
  }
  pieces_.reserve(spec_.tokens.size());
  for (size_t id = 0; id < spec_.tokens.size(); ++id) {
    pieces_.push_back(piece_of(static_cast<TokenId>(id)));
  }
}

std::vector<TokenId> BpeTokenizer::encode_impl(const std::string& text, bool add_special,
                                               bool parse_special, const ByteRanges* special_ranges) const {
  std::vector<TokenId> out;
  if (add_special && spec_.add_bos) out.push_back(spec_.bos_id);
  for (const Fragment& fragment : splitter_.split(text, parse_special, special_ranges)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      continue;
    }
    for (const std::string& word : pretokenize(fragment.text, spec_.pre)) {
      encode_word(unicode::bytes_to_chars(word), &out);
    }
  }
  if (add_special && spec_.add_eos) out.push_back(spec_.eos_id);
  return out;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<TokenId>* out) const {
  if (spec_.ignore_merges) {
    if (const TokenId id = find_token(index_, word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  const auto rank = [this](std::string_view left,
                           std::string_view right) -> std::optional<double> {
    const auto it = ranks_.find(MergeView(left, right));
    if (it == ranks_.end()) return std::nullopt;  // a pair the merges do not list
    return -it->second;                           // lowest rank merges first
  };
  for (std::string_view symbol : merge_symbols(word, rank)) emit_symbol(symbol, out);
}

// A symbol missing from the vocabulary (a merge the vocabulary lacks, or a byte character it
// lacks: SmolLM2 has no token for some bytes that only start rare code points) falls back to
// one token per byte character, and a character without a token is dropped, as in llama.cpp.
// llama.cpp looks up the raw UTF-8 bytes of the symbol, which finds only ASCII characters; the
// results differ only for a merged non-ASCII symbol absent from the vocabulary, which a
// consistent file does not have.
void BpeTokenizer::emit_symbol(std::string_view symbol, std::vector<TokenId>* out) const {
  if (const TokenId id = find_token(index_, std::string(symbol)); id >= 0) {
    out->push_back(id);
    return;
  }
  for (size_t pos = 0; pos < symbol.size();) {
    const size_t start = pos;
    unicode::decode_one(symbol, &pos);
    const TokenId id = find_token(index_, std::string(symbol.substr(start, pos - start)));
    if (id >= 0) out->push_back(id);
  }
}

std::string BpeTokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  const TokenKind kind = token_kind(spec_, id);
  if (!render_special && (kind == TokenKind::kControl || kind == TokenKind::kUnknown)) return {};
  return pieces_[id];
}

// The bytes a token stands for: normal tokens are un-byte-mapped; special and user-defined
// tokens are their text; unused and undefined tokens are empty, as in llama.cpp.
std::string BpeTokenizer::piece_of(TokenId id) const {
  const std::string& text = spec_.tokens[id];
  switch (token_kind(spec_, id)) {
    case TokenKind::kControl:
    case TokenKind::kUnknown:
    case TokenKind::kUserDefined:
      return text;
    case TokenKind::kByte:
      // "<0xNN>" (SentencePiece-style byte tokens in a BPE vocabulary).
      if (const int byte = byte_token_value(text); byte >= 0) {
        return std::string(1, static_cast<char>(byte));
      }
      break;
    case TokenKind::kNormal:
      break;
    case TokenKind::kUndefined:
    case TokenKind::kUnused:
      return {};
  }
  // A character outside the byte map is kept as it is (llama.cpp writes "[UNK_BYTE_0x..]").
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const int byte = unicode::char_to_byte(unicode::decode_one(text, &pos));
    if (byte >= 0) {
      bytes.push_back(static_cast<char>(byte));
    } else {
      bytes.append(text, start, pos - start);
    }
  }
  return bytes;
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec) {
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace helios
