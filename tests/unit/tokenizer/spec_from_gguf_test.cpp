#include <gtest/gtest.h>

#include <filesystem>

#include "helios/gguf.h"
#include "helios/tokenizer.h"
#include "test_paths.h"

namespace helios {
namespace {

const char kSmolLMSystem[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// A GGUF image holding only tokenizer metadata, parsed back through the real reader.
class TokenizerGguf {
 public:
  TokenizerGguf(const std::string& model, std::vector<std::string> tokens) {
    writer.set_string("tokenizer.ggml.model", model);
    writer.set_string_array("tokenizer.ggml.tokens", tokens);
    if (model == "gpt2") writer.set_string_array("tokenizer.ggml.merges", {"a b"});
  }
  StatusOr<TokenizerSpec> spec() {
    bytes_ = writer.serialize();
    auto file = GgufFile::parse(bytes_.data(), bytes_.size(), "tiny.gguf");
    if (!file.ok()) return file.status();
    return tokenizer_spec_from_gguf(**file);
  }
  GgufWriter writer;

 private:
  std::vector<uint8_t> bytes_;
};

void expect_error(TokenizerGguf& gguf, StatusCode code, const std::vector<std::string>& words) {
  auto spec = gguf.spec();
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), code) << spec.status().to_string();
  for (const std::string& w : words) {
    EXPECT_NE(spec.status().message().find(w), std::string::npos) << spec.status().message();
  }
}

TEST(SpecFromGguf, ByteLevelBpeWithItsKeys) {
  TokenizerGguf gguf("gpt2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab"});
  gguf.writer.set_string("tokenizer.ggml.pre", "smollm");
  gguf.writer.set_int32_array("tokenizer.ggml.token_type", {3, 3, 3, 1, 1, 1});
  gguf.writer.set_uint32("tokenizer.ggml.bos_token_id", 1);
  gguf.writer.set_uint32("tokenizer.ggml.eos_token_id", 2);
  gguf.writer.set_uint32("tokenizer.ggml.unknown_token_id", 0);
  auto spec = gguf.spec();
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->model, TokenizerModel::kByteLevelBpe);
  EXPECT_EQ(spec->pre, PreTokenizer::kSmolLM);
  EXPECT_EQ(spec->tokens.size(), 6u);
  EXPECT_EQ(spec->kinds[1], TokenKind::kControl);
  EXPECT_EQ(spec->merges, std::vector<std::string>{"a b"});
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_EQ(spec->unk_id, 0);
  EXPECT_EQ(spec->eot_id, 2);  // found by its text: <|im_end|>
  EXPECT_FALSE(spec->add_bos);  // byte-level BPE does not add BOS unless told to
  EXPECT_FALSE(spec->add_space_prefix);
  EXPECT_EQ(spec->chat, ChatTemplate::kChatML);  // no template: inferred from <|im_start|>
  EXPECT_TRUE(spec->chat_default_system.empty());
}

TEST(SpecFromGguf, PreTokenizerNames) {
  const std::vector<std::pair<std::string, PreTokenizer>> cases = {
      {"gpt-2", PreTokenizer::kGpt2},        {"default", PreTokenizer::kGpt2},
      {"starcoder", PreTokenizer::kSmolLM},  {"refact", PreTokenizer::kSmolLM},
      {"command-r", PreTokenizer::kSmolLM},  {"llama-bpe", PreTokenizer::kLlama3},
      {"smaug-bpe", PreTokenizer::kLlama3},  {"qwen2", PreTokenizer::kQwen2},
      {"deepseek-r1-qwen", PreTokenizer::kQwen2},
  };
  for (const auto& [name, pre] : cases) {
    TokenizerGguf gguf("gpt2", {"a", "b"});
    gguf.writer.set_string("tokenizer.ggml.pre", name);
    gguf.writer.set_uint32("tokenizer.ggml.bos_token_id", 0);  // the Llama 3 names add BOS
    auto spec = gguf.spec();
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status().to_string();
    EXPECT_EQ(spec->pre, pre) << name;
  }
  TokenizerGguf absent("gpt2", {"a"});
  EXPECT_EQ(absent.spec()->pre, PreTokenizer::kGpt2);
}

TEST(SpecFromGguf, Llama3NamesAddBosAndSkipMergesForWholeWords) {
  TokenizerGguf gguf("gpt2", {"<|begin_of_text|>", "a"});
  gguf.writer.set_string("tokenizer.ggml.pre", "llama-bpe");
  gguf.writer.set_uint32("tokenizer.ggml.bos_token_id", 0);
  auto spec = gguf.spec();
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_TRUE(spec->add_bos);
  EXPECT_TRUE(spec->ignore_merges);

  TokenizerGguf smaug("gpt2", {"a"});
  smaug.writer.set_string("tokenizer.ggml.pre", "smaug-bpe");
  EXPECT_FALSE(smaug.spec()->ignore_merges);
  EXPECT_FALSE(smaug.spec()->add_bos);

  // Qwen2 merges every word and adds no BOS, as llama.cpp does for it.
  TokenizerGguf qwen("gpt2", {"a"});
  qwen.writer.set_string("tokenizer.ggml.pre", "qwen2");
  EXPECT_FALSE(qwen.spec()->ignore_merges);
  EXPECT_FALSE(qwen.spec()->add_bos);
}

TEST(SpecFromGguf, SentencePieceDefaultsFollowLlamaCpp) {
  TokenizerGguf gguf("llama", {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a"});
  gguf.writer.set_float32_array("tokenizer.ggml.scores", {0, 0, 0, -1.5f});
  auto spec = gguf.spec();
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->model, TokenizerModel::kSentencePiece);
  EXPECT_EQ(spec->unk_id, 0);
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_FALSE(spec->add_eos);
  EXPECT_TRUE(spec->add_space_prefix);
  EXPECT_EQ(spec->scores[3], -1.5f);
  EXPECT_EQ(spec->chat, ChatTemplate::kNone);

  TokenizerGguf flags("llama", {"<unk>", "<s>", "</s>"});
  flags.writer.set_bool("tokenizer.ggml.add_bos_token", false);
  flags.writer.set_bool("tokenizer.ggml.add_eos_token", true);
  flags.writer.set_bool("tokenizer.ggml.add_space_prefix", false);
  auto overridden = flags.spec();
  ASSERT_TRUE(overridden.ok()) << overridden.status().to_string();
  EXPECT_FALSE(overridden->add_bos);
  EXPECT_TRUE(overridden->add_eos);
  EXPECT_FALSE(overridden->add_space_prefix);
}

TEST(SpecFromGguf, DefaultIdsOutsideATinyVocabularyAreDropped) {
  TokenizerGguf gguf("llama", {"<unk>", "<s>"});  // no id 2 for the default EOS
  gguf.writer.set_bool("tokenizer.ggml.add_bos_token", true);
  auto spec = gguf.spec();
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->eos_id, -1);
}

TEST(SpecFromGguf, ChatTemplatesAreRecognisedByMarkers) {
  const std::vector<std::pair<std::string, ChatTemplate>> cases = {
      {"{{ '<|im_start|>' + message['role'] }}", ChatTemplate::kChatML},
      {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}", ChatTemplate::kLlama3},
      {"{{ bos_token + '[INST] ' + content + ' [/INST]' }}", ChatTemplate::kLlama2},
      {"{{ message['content'] }}", ChatTemplate::kNone},
  };
  for (const auto& [text, chat] : cases) {
    TokenizerGguf gguf("gpt2", {"a"});
    gguf.writer.set_string("tokenizer.chat_template", text);
    EXPECT_EQ(gguf.spec()->chat, chat) << text;
  }
}

TEST(SpecFromGguf, DefaultSystemPromptComesFromTheTemplate) {
  const std::string smollm_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\n" + std::string(kSmolLMSystem) + "<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  TokenizerGguf gguf("gpt2", {"a"});
  gguf.writer.set_string("tokenizer.chat_template", smollm_template);
  EXPECT_EQ(gguf.spec()->chat_default_system, kSmolLMSystem);

  // A system turn built from the message is no default.
  TokenizerGguf plain("gpt2", {"a"});
  plain.writer.set_string("tokenizer.chat_template",
                          "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                          "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}");
  EXPECT_EQ(plain.spec()->chat, ChatTemplate::kChatML);
  EXPECT_TRUE(plain.spec()->chat_default_system.empty());
}

TEST(SpecFromGguf, UnsupportedModelAndPreListTheSupportedOnes) {
  TokenizerGguf bert("bert", {"a"});
  expect_error(bert, StatusCode::kInvalidArgument, {"tokenizer.ggml.model", "'bert'", "gpt2", "llama"});
  TokenizerGguf pre("gpt2", {"a"});
  pre.writer.set_string("tokenizer.ggml.pre", "chatglm-bpe");
  expect_error(pre, StatusCode::kInvalidArgument,
               {"tokenizer.ggml.pre", "'chatglm-bpe'", "smollm", "llama3", "qwen2"});
}

TEST(SpecFromGguf, BadValuesNameTheirKey) {
  TokenizerGguf bos("gpt2", {"a", "b"});
  bos.writer.set_uint32("tokenizer.ggml.bos_token_id", 2);
  expect_error(bos, StatusCode::kInvalidArgument, {"tokenizer.ggml.bos_token_id", "= 2"});

  TokenizerGguf scores("llama", {"<unk>", "<s>", "</s>"});
  scores.writer.set_float32_array("tokenizer.ggml.scores", {0, 0});
  expect_error(scores, StatusCode::kInvalidArgument, {"tokenizer.ggml.scores", "2 entries", "3"});

  TokenizerGguf types("gpt2", {"a", "b"});
  types.writer.set_int32_array("tokenizer.ggml.token_type", {1, 9});
  expect_error(types, StatusCode::kInvalidArgument, {"tokenizer.ggml.token_type[1] = 9"});

  TokenizerGguf wrong_type("gpt2", {"a"});
  wrong_type.writer.set_string("tokenizer.ggml.eos_token_id", "zero");
  expect_error(wrong_type, StatusCode::kInvalidArgument, {"tokenizer.ggml.eos_token_id"});

  TokenizerGguf add_bos("gpt2", {"a"});
  add_bos.writer.set_bool("tokenizer.ggml.add_bos_token", true);
  expect_error(add_bos, StatusCode::kInvalidArgument, {"tokenizer.ggml.bos_token_id"});
}

TEST(SpecFromGguf, MissingRequiredKeys) {
  GgufWriter writer;
  writer.set_string("tokenizer.ggml.model", "gpt2");
  writer.set_string_array("tokenizer.ggml.tokens", {"a"});
  std::vector<uint8_t> bytes = writer.serialize();
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "no-merges.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto spec = tokenizer_spec_from_gguf(**file);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("tokenizer.ggml.merges"), std::string::npos);

  GgufWriter empty;
  bytes = empty.serialize();
  file = GgufFile::parse(bytes.data(), bytes.size(), "empty.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  spec = tokenizer_spec_from_gguf(**file);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("tokenizer.ggml.model"), std::string::npos);
}

// The default model, when the models cache has it.
class SmolLM2Tokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = helios::testing::default_model_path();
    ASSERT_TRUE(std::filesystem::exists(path)) << "no model at " << path << ": run scripts/fetch_model.sh";
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    auto spec = tokenizer_spec_from_gguf(**file);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    auto tokenizer = Tokenizer::create(*spec);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    tokenizer_ = std::move(tokenizer).value();
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SmolLM2Tokenizer, ReadsTheFilesSettings) {
  const TokenizerSpec& spec = tokenizer_->spec();
  EXPECT_EQ(tokenizer_->n_vocab(), 49152);
  EXPECT_EQ(spec.pre, PreTokenizer::kSmolLM);
  EXPECT_EQ(spec.bos_id, 1);
  EXPECT_EQ(spec.eos_id, 2);
  EXPECT_FALSE(spec.add_bos);
  EXPECT_EQ(spec.chat, ChatTemplate::kChatML);
  EXPECT_EQ(spec.chat_default_system, kSmolLMSystem);
  EXPECT_TRUE(tokenizer_->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(tokenizer_->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tokenizer_->is_end_of_generation(1));
}

// Ids checked with llama.cpp (tests/golden/data/smollm2_tokenize.json has many more).
TEST_F(SmolLM2Tokenizer, EncodesLikeLlamaCpp) {
  using Ids = std::vector<TokenId>;
  EXPECT_EQ(tokenizer_->encode("Hello world", false, false), (Ids{19556, 905}));
  EXPECT_EQ(tokenizer_->encode("Hello world", true, false), (Ids{19556, 905}));
  EXPECT_EQ(tokenizer_->encode("<|im_start|>user\nHi<|im_end|>\n", false, true)[0], 1);
  EXPECT_NE(tokenizer_->encode("<|im_start|>", false, false), (Ids{1}));
  EXPECT_EQ(tokenizer_->decode(tokenizer_->encode("x = 12345; // ok?\n\tdone", false, false)),
            "x = 12345; // ok?\n\tdone");
}

}  // namespace
}  // namespace helios
