#include "tokenizer/pretokenize.h"

#include <cstdint>

#include "tokenizer/unicode.h"

namespace helios {

namespace {

// What the split patterns ask of a code point; computed once per text.
enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 4 };

uint8_t classify(uint32_t cp) {
  uint8_t c = kOther;
  if (unicode::is_letter(cp)) c |= kLetter;
  if (unicode::is_number(cp)) c |= kNumber;
  if (unicode::is_whitespace(cp)) c |= kSpace;
  return c;
}

constexpr uint32_t kOutside = 0xFFFFFFFF;

uint32_t ascii_lower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp; }

// Splits the code points [begin, end) of a text. Reads outside the range see nothing, the way
// a regex match cannot look past the fragment it runs on. Word boundaries go to `word_ends`.
class Splitter {
 public:
  Splitter(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& classes, size_t begin,
           size_t end, std::vector<size_t>* word_ends)
      : cps_(cps), classes_(classes), begin_(begin), end_(end), last_(begin),
        word_ends_(word_ends) {}

  void split_gpt2();
  // Llama 3's pattern; Qwen2's is the same with at most one digit a word (max_digits = 1).
  void split_llama3(size_t max_digits);

 private:
  bool inside(size_t pos) const { return pos >= begin_ && pos < end_; }
  uint32_t at(size_t pos) const { return inside(pos) ? cps_[pos] : kOutside; }
  bool letter(size_t pos) const { return inside(pos) && (classes_[pos] & kLetter); }
  bool number(size_t pos) const { return inside(pos) && (classes_[pos] & kNumber); }
  bool space(size_t pos) const { return inside(pos) && (classes_[pos] & kSpace); }
  // [^\s\p{L}\p{N}]
  bool other(size_t pos) const { return inside(pos) && classes_[pos] == kOther; }
  bool newline(size_t pos) const { return at(pos) == '\r' || at(pos) == '\n'; }

  void emit(size_t end) {
    if (end > last_) word_ends_->push_back(end);
    last_ = end;
  }
  size_t contraction_length(size_t pos, bool ignore_case) const;
  size_t whitespace_run(size_t pos) const;

  const std::vector<uint32_t>& cps_;
  const std::vector<uint8_t>& classes_;
  size_t begin_, end_, last_;
  std::vector<size_t>* word_ends_;
};

// 's|'t|'re|'ve|'m|'ll|'d (case-insensitive for Llama 3); 0 when none starts at `pos`.
size_t Splitter::contraction_length(size_t pos, bool ignore_case) const {
  if (at(pos) != '\'' || !inside(pos + 1)) return 0;
  const auto fold = [&](uint32_t cp) { return ignore_case ? ascii_lower(cp) : cp; };
  const uint32_t c1 = fold(at(pos + 1));
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (!inside(pos + 2)) return 0;
  const uint32_t c2 = fold(at(pos + 2));
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

size_t Splitter::whitespace_run(size_t pos) const {
  size_t n = 0;
  while (space(pos + n)) ++n;
  return n;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void Splitter::split_gpt2() {
  size_t pos = begin_;
  while (pos < end_) {
    if (const size_t n = contraction_length(pos, /*ignore_case=*/false)) {
      emit(pos += n);
      continue;
    }
    // The optional leading space belongs to the word that follows it.
    const size_t lead = at(pos) == ' ' ? pos + 1 : pos;
    if (letter(lead) || number(lead) || other(lead)) {
      bool (Splitter::*same)(size_t) const =
          letter(lead) ? &Splitter::letter : number(lead) ? &Splitter::number : &Splitter::other;
      pos = lead;
      while ((this->*same)(pos)) ++pos;
      emit(pos);
      continue;
    }
    const size_t n_spaces = whitespace_run(pos);
    if (n_spaces > 1 && inside(pos + n_spaces)) {
      // \s+(?!\S): leave the last space to prefix the next word.
      emit(pos += n_spaces - 1);
    } else if (n_spaces > 0) {
      emit(pos += n_spaces);
    } else {
      emit(++pos);  // unreachable for in-range text; keeps the loop finite regardless
    }
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+   (Qwen2: \p{N} in place of \p{N}{1,3})
void Splitter::split_llama3(size_t max_digits) {
  size_t pos = begin_;
  while (pos < end_) {
    if (const size_t n = contraction_length(pos, /*ignore_case=*/true)) {
      emit(pos += n);
      continue;
    }
    if (!newline(pos) && !number(pos) && (letter(pos) || letter(pos + 1))) {
      ++pos;  // the letter itself, or the one non-letter allowed before the letters
      while (letter(pos)) ++pos;
      emit(pos);
      continue;
    }
    if (number(pos)) {
      for (size_t n = 0; number(pos) && n < max_digits; ++n) ++pos;
      emit(pos);
      continue;
    }
    const size_t lead = at(pos) == ' ' ? pos + 1 : pos;
    if (other(lead)) {
      pos = lead;
      while (other(pos)) ++pos;
      while (newline(pos)) ++pos;
      emit(pos);
      continue;
    }
    const size_t n_spaces = whitespace_run(pos);
    size_t newline_end = 0;  // just past the last \r or \n of the run
    for (size_t i = 0; i < n_spaces; ++i) {
      if (newline(pos + i)) newline_end = pos + i + 1;
    }
    if (newline_end > 0) {
      emit(pos = newline_end);  // \s*[\r\n]+
    } else if (n_spaces > 1 && inside(pos + n_spaces)) {
      emit(pos += n_spaces - 1);
    } else if (n_spaces > 0) {
      emit(pos += n_spaces);
    } else {
      emit(++pos);
    }
  }
}

// SmolLM (and StarCoder, Refact, ...): every \p{N} is a word by itself; the GPT-2 pattern then
// runs separately on each stretch between them, so " 1" is not kept together.
void split_smollm(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& classes,
                  std::vector<size_t>* word_ends) {
  size_t start = 0;
  for (size_t pos = 0; pos <= cps.size(); ++pos) {
    const bool at_end = pos == cps.size();
    if (!at_end && !(classes[pos] & kNumber)) continue;
    Splitter(cps, classes, start, pos, word_ends).split_gpt2();
    if (!at_end) word_ends->push_back(pos + 1);
    start = pos + 1;
  }
}

}  // namespace

std::vector<std::string> pretokenize(std::string_view text, PreTokenizer pre) {
  const std::vector<uint32_t> cps = unicode::decode(text);
  std::vector<uint8_t> classes(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) classes[i] = classify(cps[i]);

  std::vector<size_t> word_ends;
  switch (pre) {
    case PreTokenizer::kGpt2:
      Splitter(cps, classes, 0, cps.size(), &word_ends).split_gpt2();
      break;
    case PreTokenizer::kSmolLM:
      split_smollm(cps, classes, &word_ends);
      break;
    case PreTokenizer::kLlama3:
      Splitter(cps, classes, 0, cps.size(), &word_ends).split_llama3(3);
      break;
    case PreTokenizer::kQwen2:
      Splitter(cps, classes, 0, cps.size(), &word_ends).split_llama3(1);
      break;
  }

  std::vector<std::string> words;
  words.reserve(word_ends.size());
  size_t start = 0;
  for (size_t end : word_ends) {
    std::string word;
    for (size_t i = start; i < end; ++i) unicode::append_utf8(cps[i], &word);
    words.push_back(std::move(word));
    start = end;
  }
  return words;
}

}  // namespace helios
