// SentencePiece-style BPE (llama2.c, Llama 2), following llama.cpp's llm_tokenizer_spm: spaces
// become "▁", adjacent symbols merge greedily by the score of the merged piece, and characters
// no piece covers fall back to <0xNN> byte tokens.

#include <queue>
#include <string_view>
#include <utility>

#include "tokenizer/unicode.h"
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

// Bytes [start, start + length) of the text being merged, in a linked list; a symbol merged
// into its left neighbour keeps length 0.
struct Symbol {
  size_t start;
  size_t length;
  int prev;
  int next;
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t length;  // left + right when queued; differs once either side has changed
};

// Top of the queue: highest score, then leftmost.
struct BigramBelow {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(TokenizerSpec spec)
      : Tokenizer(std::move(spec)), index_(build_token_index(spec_)), splitter_(spec_) {}

  std::vector<TokenId> encode(const std::string& text, bool add_special,
                              bool parse_special) const override;
  std::string token_to_piece(TokenId id, bool render_special) const override;

 private:
  using Queue = std::priority_queue<Bigram, std::vector<Bigram>, BigramBelow>;

  void encode_text(const std::string& text, std::vector<TokenId>* out) const;
  void push_bigram(const std::string& text, const std::vector<Symbol>& symbols, int left,
                   int right, Queue* queue) const;
  void emit_bytes(std::string_view bytes, std::vector<TokenId>* out) const;

  TokenIndex index_;
  SpecialTokenSplitter splitter_;
};

std::vector<TokenId> SpmTokenizer::encode(const std::string& text, bool add_special,
                                          bool parse_special) const {
  std::vector<TokenId> out;
  if (add_special && spec_.add_bos) out.push_back(spec_.bos_id);
  // llama.cpp prefixes the space to every text fragment that starts the input or follows a
  // special token, not only to the first one.
  bool after_special = true;
  for (const Fragment& fragment : splitter_.split(text, parse_special)) {
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
  // Symbols are characters by their lead byte only, like llama.cpp: malformed bytes simply end
  // up in a symbol no piece covers, and leave as byte tokens.
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length =
        std::min(unicode::sequence_length(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({pos, length, index - 1, pos + length < text.size() ? index + 1 : -1});
    pos += length;
  }
  Queue queue;
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) {
    push_bigram(text, symbols, i - 1, i, &queue);
  }
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;  // stale: a side was merged away or grew since this pair was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    push_bigram(text, symbols, left.prev, bigram.left, &queue);
    push_bigram(text, symbols, bigram.left, left.next, &queue);
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string piece = text.substr(symbols[i].start, symbols[i].length);
    if (const TokenId id = find_token(index_, piece); id >= 0) {
      out->push_back(id);
    } else {
      emit_bytes(piece, out);
    }
  }
}

void SpmTokenizer::push_bigram(const std::string& text, const std::vector<Symbol>& symbols,
                               int left, int right, Queue* queue) const {
  if (left < 0 || right < 0) return;
  const size_t length = symbols[left].length + symbols[right].length;
  const TokenId id = find_token(index_, text.substr(symbols[left].start, length));
  if (id < 0) return;
  const float score = spec_.scores.empty() ? 0.0f : spec_.scores[id];
  queue->push({left, right, score, length});
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
