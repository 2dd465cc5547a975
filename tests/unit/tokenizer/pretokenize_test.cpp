#include "tokenizer/pretokenize.h"

#include <gtest/gtest.h>

#include <random>

#include "tokenizer/unicode.h"

namespace helios {
namespace {

using Words = std::vector<std::string>;

Words gpt2(const std::string& text) { return pretokenize(text, PreTokenizer::kGpt2); }
Words smollm(const std::string& text) { return pretokenize(text, PreTokenizer::kSmolLM); }
Words llama3(const std::string& text) { return pretokenize(text, PreTokenizer::kLlama3); }
Words qwen2(const std::string& text) { return pretokenize(text, PreTokenizer::kQwen2); }

TEST(PretokenizeGpt2, WordsKeepTheirLeadingSpace) {
  EXPECT_EQ(gpt2("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(gpt2(""), Words{});
}

TEST(PretokenizeGpt2, ContractionsAreCaseSensitive) {
  EXPECT_EQ(gpt2("I'm can't we'll they've"),
            (Words{"I", "'m", " can", "'t", " we", "'ll", " they", "'ve"}));
  EXPECT_EQ(gpt2("DON'T"), (Words{"DON", "'", "T"}));
}

TEST(PretokenizeGpt2, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  EXPECT_EQ(gpt2("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(gpt2("a  "), (Words{"a", "  "}));
  EXPECT_EQ(gpt2("\n\nHello"), (Words{"\n", "\n", "Hello"}));
  EXPECT_EQ(gpt2("x \t y"), (Words{"x", " \t", " y"}));
}

TEST(PretokenizeGpt2, DigitsAndPunctuationRuns) {
  EXPECT_EQ(gpt2("abc 12345"), (Words{"abc", " 12345"}));
  EXPECT_EQ(gpt2("(hello)!!"), (Words{"(", "hello", ")!!"}));
  EXPECT_EQ(gpt2("3.14"), (Words{"3", ".", "14"}));
}

TEST(PretokenizeGpt2, EmojiCjkAndCombiningMarks) {
  EXPECT_EQ(gpt2("hi \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD!"),  // 👋🏽!
            (Words{"hi", " \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD!"}));
  EXPECT_EQ(gpt2("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E text"), (Words{"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " text"}));
  // A combining accent is not \p{L}: the letter run stops before it.
  EXPECT_EQ(gpt2("cafe\xCC\x81 ok"), (Words{"cafe", "\xCC\x81", " ok"}));
}

TEST(PretokenizeGpt2, MalformedBytesBecomeReplacementCharacters) {
  EXPECT_EQ(gpt2("a\xFF" "b"), (Words{"a", "\xEF\xBF\xBD", "b"}));
}

TEST(PretokenizeSmolLM, EveryDigitStandsAlone) {
  EXPECT_EQ(smollm("abc 12345"), (Words{"abc", " ", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(smollm("x1y"), (Words{"x", "1", "y"}));
  // Non-ASCII digits too (\p{N}), and the GPT-2 split runs between them.
  EXPECT_EQ(smollm("\xD9\xA3\xD9\xA4 a  b"), (Words{"\xD9\xA3", "\xD9\xA4", " a", " ", " b"}));
}

TEST(PretokenizeLlama3, ContractionsIgnoreCase) {
  EXPECT_EQ(llama3("DON'T we'LL"), (Words{"DON", "'T", " we", "'LL"}));
}

TEST(PretokenizeLlama3, OneNonLetterMayLeadAWord) {
  EXPECT_EQ(llama3("(hello) world"), (Words{"(hello", ")", " world"}));
  EXPECT_EQ(llama3("\thello"), (Words{"\thello"}));
}

TEST(PretokenizeLlama3, DigitsGoInGroupsOfThree) {
  EXPECT_EQ(llama3("abc 1234567"), (Words{"abc", " ", "123", "456", "7"}));
}

TEST(PretokenizeLlama3, NewlinesStayWithPunctuationAndWhitespace) {
  EXPECT_EQ(llama3("hi!\n\nthere"), (Words{"hi", "!\n\n", "there"}));
  EXPECT_EQ(llama3("\n\nHello"), (Words{"\n\n", "Hello"}));
  EXPECT_EQ(llama3("a  \n  x"), (Words{"a", "  \n", " ", " x"}));
  EXPECT_EQ(llama3("a\r\n"), (Words{"a", "\r\n"}));
}

TEST(PretokenizeQwen2, EveryDigitIsAWordOfItsOwn) {
  EXPECT_EQ(qwen2("abc 1234"), (Words{"abc", " ", "1", "2", "3", "4"}));
  EXPECT_EQ(qwen2("x2 + y2"), (Words{"x", "2", " +", " y", "2"}));
  EXPECT_EQ(qwen2("\xD9\xA3\xD9\xA4"), (Words{"\xD9\xA3", "\xD9\xA4"}));  // \p{N}, not only ASCII
}

TEST(PretokenizeQwen2, OtherwiseSplitsAsLlama3) {
  for (const std::string text : {"DON'T we'LL", "(hello) world", "\thello", "hi!\n\nthere",
                                 "a  \n  x", "a\r\n", "def f(x):\n    return x\n"}) {
    EXPECT_EQ(qwen2(text), llama3(text)) << text;
  }
}

// Splitting never loses or invents text: for valid UTF-8 the words concatenate to the input,
// and none is empty. Random strings over letters, digits, marks, spaces, newlines and emoji.
TEST(PretokenizeAll, WordsConcatenateToTheInput) {
  const std::vector<std::string> alphabet = {
      "a", "Z", "'", "s", "1", "9", " ", " ", "\n", "\r", "\t", "!", ".", "\xC3\xA9", "\xCC\x81",
      "\xE4\xB8\xAD", "\xD9\xA3", "\xF0\x9F\x98\x80", "\xE2\x80\x8B", "\xC2\xA0", "\xE3\x80\x80"};
  std::mt19937 rng(1234);
  for (PreTokenizer pre : {PreTokenizer::kGpt2, PreTokenizer::kSmolLM, PreTokenizer::kLlama3,
                           PreTokenizer::kQwen2}) {
    for (int iter = 0; iter < 500; ++iter) {
      std::string text;
      const int n = rng() % 24;
      for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
      std::string joined;
      for (const std::string& word : pretokenize(text, pre)) {
        EXPECT_FALSE(word.empty());
        joined += word;
      }
      ASSERT_EQ(joined, text) << "pre=" << static_cast<int>(pre);
    }
  }
}

// Arbitrary bytes: no crash, and the words are the input with malformed bytes replaced.
TEST(PretokenizeAll, ArbitraryBytesAreSafe) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text(rng() % 16, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    std::string expected;
    for (uint32_t cp : unicode::decode(text)) unicode::append_utf8(cp, &expected);
    for (PreTokenizer pre : {PreTokenizer::kGpt2, PreTokenizer::kSmolLM, PreTokenizer::kLlama3,
                           PreTokenizer::kQwen2}) {
      std::string joined;
      for (const std::string& word : pretokenize(text, pre)) joined += word;
      ASSERT_EQ(joined, expected);
    }
  }
}

}  // namespace
}  // namespace helios
