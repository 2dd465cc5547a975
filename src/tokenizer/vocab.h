// Pieces the two tokenizer kinds share: token lookup by text, the special-token split that runs
// before either model sees the text, and the factories tokenizer.cpp dispatches to.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "helios/tokenizer.h"

namespace helios {

TokenKind token_kind(const TokenizerSpec& spec, TokenId id);

// Token text -> id. A text listed twice maps to its last id, as in llama.cpp.
using TokenIndex = std::unordered_map<std::string, TokenId>;
TokenIndex build_token_index(const TokenizerSpec& spec);
TokenId find_token(const TokenIndex& index, const std::string& text);  // -1 when absent

bool is_one_of(std::string_view text, std::initializer_list<std::string_view> texts);

// Texts llama.cpp treats as ending a turn (<|eot_id|>, <|im_end|>, ...), best candidate first.
const std::vector<std::string>& end_of_turn_texts();
bool is_end_of_turn_text(std::string_view text);

// Fill-in-the-middle markers llama.cpp finds by their text (Qwen2.5-Coder's <|fim_prefix|>,
// StarCoder's <fim_prefix>, ...) and makes control tokens whatever the file says; the padding,
// repository and file-separator markers also end generation there.
bool is_fim_marker_text(std::string_view text);
bool is_fim_end_of_generation_text(std::string_view text);

// The byte a "<0xNN>" byte-fallback token stands for, or -1 if `text` is not one.
int byte_token_value(std::string_view text);

// A run of input text, or a special token found in it (token >= 0; `text` is then empty).
struct Fragment {
  TokenId token = -1;
  std::string_view text;
};

// Splits input around special-token texts like llama.cpp's tokenizer_st_partition: control,
// user-defined and unknown tokens, longest first, each cutting every remaining text fragment.
// Control and unknown tokens take part only when `parse_special`, and with `special_ranges` only
// where their text lies inside one of those byte ranges of `text`.
class SpecialTokenSplitter {
 public:
  explicit SpecialTokenSplitter(const TokenizerSpec& spec);
  std::vector<Fragment> split(std::string_view text, bool parse_special,
                              const ByteRanges* special_ranges = nullptr) const;

 private:
  struct Special {
    TokenId id;
    std::string text;
    bool needs_parse_special;
  };
  std::vector<Special> specials_;  // longest text first, then lowest id
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec);
std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec);

}  // namespace helios
