// Tokenizers read from GGUF metadata: byte-level BPE (GPT-2 style pre-tokenization: SmolLM2,
// Llama 3, Qwen2) and SentencePiece-style BPE with byte fallback (llama2.c, Llama 2), with the same
// results as llama.cpp's tokenizer for the same file.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "helios/status.h"

namespace helios {

class GgufFile;

using TokenId = int32_t;

// Token kinds, numbered as `tokenizer.ggml.token_type` numbers them.
enum class TokenKind : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

enum class TokenizerModel { kByteLevelBpe /* "gpt2" */, kSentencePiece /* "llama" */ };

// How text is split before byte-level BPE merges (tokenizer.ggml.pre).
enum class PreTokenizer {
  kGpt2,       // "'s|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
  kSmolLM,     // every digit alone, then kGpt2 (also starcoder, refact, ...)
  kLlama3,     // Llama 3: case-insensitive contractions, \p{N}{1,3}, newline handling
  kQwen2,      // Qwen2: kLlama3 with every digit a word of its own (\p{N} for \p{N}{1,3})
};

enum class ChatTemplate { kNone, kChatML, kLlama2, kLlama3 };

// Everything a tokenizer needs, as plain data (so tests can build one without a file).
struct TokenizerSpec {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  PreTokenizer pre = PreTokenizer::kGpt2;
  std::vector<std::string> tokens;   // id -> token text (byte-level BPE: GPT-2 byte-mapped)
  std::vector<float> scores;         // SentencePiece merge priority (empty for BPE)
  std::vector<TokenKind> kinds;      // empty means all kNormal
  std::vector<std::string> merges;   // BPE merges "a b", highest priority first
  TokenId bos_id = -1;
  TokenId eos_id = -1;
  TokenId unk_id = -1;
  TokenId eot_id = -1;               // end-of-turn (e.g. <|eot_id|>, <|im_end|>), -1 if none
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;     // SentencePiece: prepend "▁" to the text
  bool ignore_merges = false;        // BPE: a pre-tokenized word that is a token skips merging
  std::string chat_template;         // tokenizer.chat_template as the file has it ("" if none)
  ChatTemplate chat = ChatTemplate::kNone;  // the format its markers (or the vocabulary) point to
  std::string chat_default_system;   // system prompt the template adds when none is given
};

// Reads tokenizer.ggml.* and tokenizer.chat_template (kept as text for the chat module, which
// runs it; `chat` is the format recognised from its markers, the fallback when it cannot run).
// Unsupported tokenizer models or pre-tokenizers are INVALID_ARGUMENT naming the value and listing
// the supported ones.
StatusOr<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& file);

// Byte ranges [first, second) of a text, sorted and disjoint.
using ByteRanges = std::vector<std::pair<size_t, size_t>>;

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> create(TokenizerSpec spec);
  virtual ~Tokenizer() = default;

  // `add_special`: add BOS/EOS as the model's flags say. `parse_special`: text that spells a
  // control token (e.g. "<|im_start|>") becomes that token; user-defined tokens always do.
  std::vector<TokenId> encode(const std::string& text, bool add_special, bool parse_special) const {
    return encode_impl(text, add_special, parse_special, nullptr);
  }
  // As encode(text, add_special, /*parse_special=*/true), except that a control token counts only
  // where its whole text lies inside one of `special_ranges` (the text a chat template wrote);
  // elsewhere the same characters stay plain text. The text is tokenized as one piece either way.
  std::vector<TokenId> encode_with_special_ranges(const std::string& text, bool add_special,
                                                  const ByteRanges& special_ranges) const {
    return encode_impl(text, add_special, true, &special_ranges);
  }
  // The bytes of one token (byte tokens give their byte; BPE tokens are un-byte-mapped).
  // Control tokens give their text only when `render_special`.
  virtual std::string token_to_piece(TokenId id, bool render_special) const = 0;
  std::string decode(const std::vector<TokenId>& ids, bool render_special = false) const;
  // token_to_piece(id, false) of every token, made on first use (structured output tests each
  // token's bytes against the grammar).
  const std::vector<std::string>& pieces() const;

  const TokenizerSpec& spec() const { return spec_; }
  int32_t n_vocab() const { return static_cast<int32_t>(spec_.tokens.size()); }
  TokenId bos() const { return spec_.bos_id; }
  TokenId eos() const { return spec_.eos_id; }
  // EOS, end-of-turn and other end-of-generation tokens.
  bool is_end_of_generation(TokenId id) const;
  bool is_control(TokenId id) const;

 protected:
  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  // `special_ranges` null: control tokens count everywhere when `parse_special`.
  virtual std::vector<TokenId> encode_impl(const std::string& text, bool add_special, bool parse_special,
                                           const ByteRanges* special_ranges) const = 0;
  TokenizerSpec spec_;

 private:
  mutable std::once_flag pieces_once_;
  mutable std::vector<std::string> pieces_;
};

// Turns a stream of token ids into text deltas that are always whole UTF-8: bytes of a character
// split across tokens are held back until the character is complete.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(TokenId id);  // the new complete text, possibly empty
  std::string flush();           // whatever is held back (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

// The text with every invalid UTF-8 sequence replaced by U+FFFD (for a piece or a decode that
// may split a character).
std::string valid_utf8(std::string_view text);

}  // namespace helios
