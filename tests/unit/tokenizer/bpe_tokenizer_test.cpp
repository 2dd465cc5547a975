#include <gtest/gtest.h>

#include <random>

#include "helios/tokenizer.h"
#include "tokenizer/unicode.h"
#include "unit/tokenizer/tiny_vocab.h"

namespace helios {
namespace {

using Ids = std::vector<TokenId>;
using testing::byte_level_spec;

std::unique_ptr<Tokenizer> make(TokenizerSpec spec) {
  auto tokenizer = Tokenizer::create(std::move(spec));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

Ids bytes_of(const std::string& text) {
  Ids ids;
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(BpeTokenizer, LowestRankMergesFirst) {
  // ids: 256 "bc", 257 "ab"
  auto bc_first = make(byte_level_spec({"bc", "ab"}, {"b c", "a b"}));
  EXPECT_EQ(bc_first->encode("abc", false, false), (Ids{'a', 256}));
  auto ab_first = make(byte_level_spec({"bc", "ab"}, {"a b", "b c"}));
  EXPECT_EQ(ab_first->encode("abc", false, false), (Ids{257, 'c'}));
}

TEST(BpeTokenizer, EqualRanksMergeLeftmostFirst) {
  auto tok = make(byte_level_spec({"aa"}, {"a a"}));
  EXPECT_EQ(tok->encode("aaa", false, false), (Ids{256, 'a'}));
  EXPECT_EQ(tok->encode("aaaa", false, false), (Ids{256, 256}));
}

TEST(BpeTokenizer, MergesChainWithinAWordOnly) {
  // "Ġ" is the byte-mapped space.
  auto tok = make(byte_level_spec({"\xC4\xA0w", "or", "\xC4\xA0wor", "ld", "\xC4\xA0world"},
                                  {"\xC4\xA0 w", "o r", "\xC4\xA0w or", "l d", "\xC4\xA0wor ld"}));
  EXPECT_EQ(tok->encode("hello world", false, false), (Ids{'h', 'e', 'l', 'l', 'o', 260}));
  // "world" without its space is another word: only "or" and "ld" apply.
  EXPECT_EQ(tok->encode("world", false, false), (Ids{'w', 257, 259}));
  EXPECT_EQ(tok->decode({260}), " world");
}

TEST(BpeTokenizer, NonAsciiTextIsEncodedAsByteCharacters) {
  auto tok = make(byte_level_spec({}, {}));
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (Ids{0xC3, 0xA9}));  // é
  EXPECT_EQ(tok->decode({0xC3, 0xA9}), "\xC3\xA9");
}

TEST(BpeTokenizer, MergeMissingFromVocabularyFallsBackToBytes) {
  auto tok = make(byte_level_spec({}, {"x y"}));  // "xy" merges but is no token
  EXPECT_EQ(tok->encode("xy", false, false), (Ids{'x', 'y'}));
}

TEST(BpeTokenizer, BytesWithoutATokenAreDroppedAsInLlamaCpp) {
  // SmolLM2 has no token for some bytes (0x04, 0xF1, ...); llama.cpp drops such characters.
  TokenizerSpec spec = byte_level_spec({}, {});
  spec.tokens[4] = "<unused>";
  spec.kinds[4] = TokenKind::kUnused;
  spec.unk_id = 'u';
  EXPECT_EQ(make(spec)->encode("a\x04" "b", false, false), (Ids{'a', 'b'}));
}

TEST(BpeTokenizer, IgnoreMergesTakesWholeWordTokens) {
  TokenizerSpec spec = byte_level_spec({"ab", "abc"}, {"a b"});
  EXPECT_EQ(make(spec)->encode("abc", false, false), (Ids{256, 'c'}));
  spec.ignore_merges = true;
  EXPECT_EQ(make(spec)->encode("abc", false, false), (Ids{257}));
}

TEST(BpeTokenizer, ControlTokensAreParsedOnlyWhenAsked) {
  // 256 control, 257 user-defined
  auto tok = make(byte_level_spec({"<|im_start|>", "<tool>"}, {},
                                  {TokenKind::kControl, TokenKind::kUserDefined}));
  EXPECT_EQ(tok->encode("<|im_start|>hi<tool>", false, true), (Ids{256, 'h', 'i', 257}));
  Ids plain = bytes_of("<|im_start|>hi");
  plain.push_back(257);  // user-defined tokens are matched either way
  EXPECT_EQ(tok->encode("<|im_start|>hi<tool>", false, false), plain);
}

TEST(BpeTokenizer, LongerSpecialTokensWin) {
  auto tok = make(byte_level_spec({"<s>", "<s>x"}, {}, {TokenKind::kControl, TokenKind::kControl}));
  EXPECT_EQ(tok->encode("<s>x<s>", false, true), (Ids{257, 256}));
}

TEST(BpeTokenizer, AddSpecialFollowsTheModelFlags) {
  TokenizerSpec spec = byte_level_spec({"<bos>", "<eos>"}, {},
                                       {TokenKind::kControl, TokenKind::kControl});
  spec.bos_id = 256;
  spec.eos_id = 257;
  EXPECT_EQ(make(spec)->encode("a", true, false), (Ids{'a'}));
  spec.add_bos = true;
  spec.add_eos = true;
  auto tok = make(spec);
  EXPECT_EQ(tok->encode("a", true, false), (Ids{256, 'a', 257}));
  EXPECT_EQ(tok->encode("a", false, false), (Ids{'a'}));
  EXPECT_EQ(tok->encode("", true, false), (Ids{256, 257}));
}

TEST(BpeTokenizer, PiecesHideControlTokensUnlessRendered) {
  auto tok = make(byte_level_spec({"<|im_end|>", "<tool>"}, {},
                                  {TokenKind::kControl, TokenKind::kUserDefined}));
  EXPECT_EQ(tok->token_to_piece(256, false), "");
  EXPECT_EQ(tok->token_to_piece(256, true), "<|im_end|>");
  EXPECT_EQ(tok->token_to_piece(257, false), "<tool>");
  EXPECT_EQ(tok->token_to_piece(' ', false), " ");
  EXPECT_EQ(tok->token_to_piece(-1, true), "");
  EXPECT_EQ(tok->token_to_piece(100000, true), "");
  EXPECT_EQ(tok->decode({'h', 256, 'i'}), "hi");
  EXPECT_EQ(tok->decode({'h', 256, 'i'}, true), "h<|im_end|>i");
}

TEST(BpeTokenizer, SplitEmojiStreamsWhole) {
  auto tok = make(byte_level_spec({}, {}));
  const std::string emoji = "\xF0\x9F\x98\x80";  // 😀
  const Ids ids = tok->encode("a" + emoji, false, false);
  ASSERT_EQ(ids, (Ids{'a', 0xF0, 0x9F, 0x98, 0x80}));
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.push(ids[0]), "a");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "");
  EXPECT_EQ(stream.push(ids[4]), emoji);
  EXPECT_EQ(stream.flush(), "");
}

// As llama.cpp: fill-in-the-middle markers are control tokens whatever the file says (parsed only
// with parse_special, printed only when special tokens are), <tool_call> stays user-defined
// (always parsed, always printed), and the FIM padding and separators end generation.
TEST(BpeTokenizer, FimMarkersAreControlAndTheirSeparatorsEndGeneration) {
  const TokenizerSpec spec = byte_level_spec(
      {"<|fim_prefix|>", "<|fim_pad|>", "<|file_sep|>", "<tool_call>", "<|im_end|>"}, {},
      {TokenKind::kUserDefined, TokenKind::kUserDefined, TokenKind::kNormal, TokenKind::kUserDefined,
       TokenKind::kNormal});
  auto tok = make(spec);
  const TokenId prefix = 256, pad = 257, sep = 258, tool = 259, im_end = 260;
  for (TokenId id : {prefix, pad, sep, im_end}) EXPECT_TRUE(tok->is_control(id)) << id;
  EXPECT_FALSE(tok->is_control(tool));
  EXPECT_EQ(tok->encode("<|fim_prefix|>x<tool_call>", false, true), (Ids{prefix, 'x', tool}));
  EXPECT_EQ(tok->encode("<|fim_prefix|>", false, false).size(), 14u);  // plain text
  EXPECT_EQ(tok->encode("<tool_call>", false, false), (Ids{tool}));
  EXPECT_EQ(tok->decode({prefix, tool}), "<tool_call>");
  EXPECT_EQ(tok->decode({prefix, tool}, true), "<|fim_prefix|><tool_call>");
  for (TokenId id : {pad, sep, im_end}) EXPECT_TRUE(tok->is_end_of_generation(id)) << id;
  for (TokenId id : {prefix, tool}) EXPECT_FALSE(tok->is_end_of_generation(id)) << id;
}

// Random bytes through every pre-tokenizer: no crash, and decode(encode(x)) is x with each
// malformed byte replaced by U+FFFD (llama.cpp's treatment of invalid input).
TEST(BpeTokenizer, ArbitraryBytesRoundTrip) {
  TokenizerSpec spec = byte_level_spec({"\xC4\xA0t", "he"}, {"\xC4\xA0 t", "h e"});
  std::mt19937 rng(7);
  for (PreTokenizer pre : {PreTokenizer::kGpt2, PreTokenizer::kSmolLM, PreTokenizer::kLlama3,
                           PreTokenizer::kQwen2}) {
    spec.pre = pre;
    auto tok = make(spec);
    for (int iter = 0; iter < 1000; ++iter) {
      std::string text(rng() % 24, '\0');
      for (char& c : text) c = static_cast<char>(rng() % 3 == 0 ? rng() % 256 : ' ' + rng() % 90);
      std::string expected;
      for (uint32_t cp : unicode::decode(text)) unicode::append_utf8(cp, &expected);
      ASSERT_EQ(tok->decode(tok->encode(text, false, false)), expected);
    }
  }
}

}  // namespace
}  // namespace helios
