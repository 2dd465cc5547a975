// The merge loop both BPE tokenizers share (llama.cpp's llm_tokenizer_bpe and _spm do the same):
// the text starts as one symbol per UTF-8 character, and the best pair of adjacent symbols is
// merged until no pair can be. The tokenizers differ only in which pairs may merge and in which
// order, which the caller gives as a priority for each pair.
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace helios {

// The priority of merging two adjacent symbols (`right` follows `left` in the same text), or
// nullopt when they may not merge. Higher merges first; equal priorities merge leftmost first.
using MergePriority = std::function<std::optional<double>(std::string_view left,
                                                          std::string_view right)>;

// Splits `text` into characters by their lead byte only, like llama.cpp: a malformed byte is a
// character of its own and a truncated sequence at the end is one short character. Merges pairs
// in `priority` order and returns the final symbols, which concatenate to `text`.
std::vector<std::string_view> merge_symbols(std::string_view text, const MergePriority& priority);

}  // namespace helios
