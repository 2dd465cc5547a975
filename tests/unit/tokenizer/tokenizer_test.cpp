#include "helios/tokenizer.h"

#include <gtest/gtest.h>

#include "unit/tokenizer/tiny_vocab.h"

namespace helios {
namespace {

using testing::byte_level_spec;

std::unique_ptr<Tokenizer> make(TokenizerSpec spec) {
  auto tokenizer = Tokenizer::create(std::move(spec));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

void expect_invalid(TokenizerSpec spec, const std::string& words) {
  auto tokenizer = Tokenizer::create(std::move(spec));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tokenizer.status().message().find(words), std::string::npos)
      << tokenizer.status().message();
}

TEST(TokenizerCreate, RejectsInconsistentSpecs) {
  expect_invalid(TokenizerSpec{}, "empty");
  TokenizerSpec spec = byte_level_spec({}, {});
  spec.scores = {1.0f, 2.0f};
  expect_invalid(spec, "2 scores for 256 tokens");
  spec = byte_level_spec({}, {});
  spec.kinds.pop_back();
  expect_invalid(spec, "255 token kinds");
  spec = byte_level_spec({}, {});
  spec.kinds[5] = static_cast<TokenKind>(9);
  expect_invalid(spec, "unknown kind 9");
  spec = byte_level_spec({}, {});
  spec.bos_id = 256;
  expect_invalid(spec, "BOS token id 256 is outside the vocabulary of 256");
  spec = byte_level_spec({}, {});
  spec.eot_id = -7;
  expect_invalid(spec, "end-of-turn token id -7");
  spec = byte_level_spec({}, {});
  spec.add_bos = true;
  expect_invalid(spec, "no BOS token");
  spec = byte_level_spec({}, {});
  spec.add_eos = true;
  expect_invalid(spec, "no EOS token");
}

// 256 <|im_start|>, 257 <|im_end|> (typed normal in the file), 258 <|endoftext|>
TokenizerSpec chat_spec() {
  TokenizerSpec spec = byte_level_spec({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, {},
                                       {TokenKind::kControl, TokenKind::kNormal,
                                        TokenKind::kControl});
  spec.eos_id = 258;
  return spec;
}

TEST(TokenizerEndOfGeneration, EosEotAndEndOfTurnTokens) {
  TokenizerSpec spec = chat_spec();
  spec.eot_id = 'x';
  auto tok = make(spec);
  EXPECT_TRUE(tok->is_end_of_generation(258));  // EOS
  EXPECT_TRUE(tok->is_end_of_generation('x'));  // the declared end-of-turn token
  EXPECT_TRUE(tok->is_end_of_generation(257));  // <|im_end|> by its text
  EXPECT_FALSE(tok->is_end_of_generation(256));
  EXPECT_FALSE(tok->is_end_of_generation('a'));
  EXPECT_FALSE(tok->is_end_of_generation(-1));
  EXPECT_FALSE(tok->is_end_of_generation(9999));
}

TEST(TokenizerEndOfGeneration, EndOfTurnTokensBecomeControlAsInLlamaCpp) {
  auto tok = make(chat_spec());
  EXPECT_TRUE(tok->is_control(257));
  EXPECT_FALSE(tok->is_control('a'));
  EXPECT_FALSE(tok->is_control(-3));
  // ...so its text is no longer matched when special tokens are not parsed.
  EXPECT_EQ(tok->encode("<|im_end|>", false, false).size(), 10u);
  EXPECT_EQ(tok->encode("<|im_end|>", false, true), std::vector<TokenId>{257});
}

TEST(TokenizerEncode, ControlTokensCountOnlyInsideTheGivenRanges) {
  auto tok = make(chat_spec());
  const std::string text = "<|im_start|>u\n<|im_end|>x<|im_end|>";  // markers at bytes 0-11, 14-23, 25-34
  EXPECT_EQ(tok->encode(text, false, true), (std::vector<TokenId>{256, 'u', '\n', 257, 'x', 257}));
  // Only the first marker and the last one lie inside a range: the middle one stays ten bytes.
  const ByteRanges ranges = {{0, 12}, {25, 35}};
  std::vector<TokenId> expected = {256, 'u', '\n'};
  for (char c : std::string("<|im_end|>x")) expected.push_back(static_cast<uint8_t>(c));
  expected.push_back(257);
  EXPECT_EQ(tok->encode_with_special_ranges(text, false, ranges), expected);
  // A range that holds only part of a marker's text does not make it a token.
  EXPECT_EQ(tok->encode_with_special_ranges("<|im_end|>", false, {{0, 5}}).size(), 10u);
  EXPECT_EQ(tok->encode_with_special_ranges("<|im_end|>", false, {}).size(), 10u);
  EXPECT_EQ(tok->encode_with_special_ranges("<|im_end|>", false, {{0, 10}}), std::vector<TokenId>{257});
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  auto tok = make(byte_level_spec({}, {}));
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.push('a'), "a");
  EXPECT_EQ(stream.push(0xFF), "\xEF\xBF\xBD");  // can never start a character: no waiting
  EXPECT_EQ(stream.push(0xE2), "");              // could still become "€"
  EXPECT_EQ(stream.push('b'), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(stream.push(0xF0), "");
  EXPECT_EQ(stream.push(0x9F), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");  // cut off by the end of the stream
  EXPECT_EQ(stream.flush(), "");
}

TEST(StreamDecoder, ControlTokensAreNotPrinted) {
  auto tok = make(chat_spec());
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.push(256), "");
  EXPECT_EQ(stream.push('o'), "o");
  EXPECT_EQ(stream.push(257), "");
}

}  // namespace
}  // namespace helios
