#include "tokenizer/vocab.h"

#include <algorithm>

namespace helios {

TokenKind token_kind(const TokenizerSpec& spec, TokenId id) {
  if (id < 0 || static_cast<size_t>(id) >= spec.tokens.size()) return TokenKind::kUndefined;
  return spec.kinds.empty() ? TokenKind::kNormal : spec.kinds[id];
}

TokenIndex build_token_index(const TokenizerSpec& spec) {
  TokenIndex index;
  index.reserve(spec.tokens.size());
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    index[spec.tokens[id]] = static_cast<TokenId>(id);
  }
  return index;
}

TokenId find_token(const TokenIndex& index, const std::string& text) {
  auto it = index.find(text);
  return it == index.end() ? -1 : it->second;
}

const std::vector<std::string>& end_of_turn_texts() {
  static const std::vector<std::string> texts = {
      "<|eot_id|>", "<|im_end|>",      "<|end|>", "<end_of_turn>", "<|endoftext|>",
      "<|eom_id|>", "<|end_of_text|>", "<EOT>",   "<end_of_utterance>",
  };
  return texts;
}

bool is_end_of_turn_text(std::string_view text) {
  for (const std::string& candidate : end_of_turn_texts()) {
    if (text == candidate) return true;
  }
  return false;
}

bool is_one_of(std::string_view text, std::initializer_list<std::string_view> texts) {
  for (std::string_view t : texts) {
    if (text == t) return true;
  }
  return false;
}

bool is_fim_end_of_generation_text(std::string_view text) {
  return is_one_of(text, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
                          "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                          "<|file_sep|>"});
}

bool is_fim_marker_text(std::string_view text) {
  return is_fim_end_of_generation_text(text) ||
         is_one_of(text, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                          "▁<PRE>", "<|code_prefix|>", "<|prefix|>",
                          "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                          "▁<SUF>", "<|code_suffix|>", "<|suffix|>",
                          "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                          "▁<MID>", "<|code_middle|>", "<|middle|>"});
}

int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

SpecialTokenSplitter::SpecialTokenSplitter(const TokenizerSpec& spec) {
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const TokenId id = static_cast<TokenId>(i);
    const TokenKind kind = token_kind(spec, id);
    // An empty text would match everywhere and never make progress.
    if (spec.tokens[i].empty()) continue;
    if (kind == TokenKind::kControl || kind == TokenKind::kUnknown) {
      specials_.push_back({id, spec.tokens[i], true});
    } else if (kind == TokenKind::kUserDefined) {
      specials_.push_back({id, spec.tokens[i], false});
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(), [](const Special& a, const Special& b) {
    return a.text.size() > b.text.size();
  });
}

namespace {

bool inside_ranges(const ByteRanges& ranges, size_t begin, size_t end) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), begin,
                             [](size_t at, const std::pair<size_t, size_t>& r) { return at < r.first; });
  return it != ranges.begin() && std::prev(it)->first <= begin && end <= std::prev(it)->second;
}

}  // namespace

std::vector<Fragment> SpecialTokenSplitter::split(std::string_view text, bool parse_special,
                                                  const ByteRanges* special_ranges) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, text});
  std::vector<Fragment> next;
  for (const Special& special : specials_) {
    if (special.needs_parse_special && !parse_special) continue;
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      std::string_view rest = fragment.text;
      for (size_t match, from = 0; (match = rest.find(special.text, from)) != std::string_view::npos;) {
        const auto at = static_cast<size_t>(rest.data() - text.data()) + match;
        if (special.needs_parse_special && special_ranges &&
            !inside_ranges(*special_ranges, at, at + special.text.size())) {
          from = match + 1;  // text from the conversation: the characters stay plain text
          continue;
        }
        from = 0;
        if (match > 0) next.push_back({-1, rest.substr(0, match)});
        next.push_back({special.id, {}});
        rest = rest.substr(match + special.text.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    fragments.swap(next);
  }
  return fragments;
}

}  // namespace helios
