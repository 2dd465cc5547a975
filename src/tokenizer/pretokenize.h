// Pre-tokenizers for byte-level BPE: hand-written equivalents of the split regexes, with the
// same results as llama.cpp's (unicode_regex_split) for the same text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "helios/tokenizer.h"

namespace helios {

// Splits `text` into words. Words are re-encoded from decoded code points, so a malformed byte
// comes out as U+FFFD, as in llama.cpp; for valid UTF-8 the words concatenate to `text`.
std::vector<std::string> pretokenize(std::string_view text, PreTokenizer pre);

}  // namespace helios
