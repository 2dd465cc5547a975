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
  spec.chat = ChatTemplate::kChatML;
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

const std::vector<ChatMessage> kConversation = {
    {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "How are you?"}};

TEST(TokenizerChat, ChatMLWithoutDefaultSystem) {
  auto tok = make(chat_spec());
  EXPECT_EQ(tok->format_chat(kConversation),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(TokenizerChat, ChatMLAddsTheTemplatesDefaultSystemOnlyWhenMissing) {
  TokenizerSpec spec = chat_spec();
  spec.chat_default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  auto tok = make(spec);
  EXPECT_EQ(tok->format_chat({{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok->format_chat({{"system", "Be brief."}, {"user", "Hi"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(tok->format_chat({}), "<|im_start|>assistant\n");
}

TEST(TokenizerChat, Llama2) {
  TokenizerSpec spec = chat_spec();
  spec.chat = ChatTemplate::kLlama2;
  auto tok = make(spec);
  EXPECT_EQ(tok->format_chat({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"},
                              {"user", "Bye"}}),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
}

TEST(TokenizerChat, Llama3TrimsContent) {
  TokenizerSpec spec = chat_spec();
  spec.chat = ChatTemplate::kLlama3;
  auto tok = make(spec);
  EXPECT_EQ(tok->format_chat({{"system", " Be brief.\n"}, {"user", "Hi"}}),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(TokenizerChat, NoTemplateConcatenatesContents) {
  TokenizerSpec spec = chat_spec();
  spec.chat = ChatTemplate::kNone;
  EXPECT_EQ(make(spec)->format_chat(kConversation), "HiHello!How are you?");
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
