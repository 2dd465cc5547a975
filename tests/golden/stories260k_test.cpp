// stories260K (llama2.c, converted to GGUF here) against llama2.c's published greedy output.
#include <gtest/gtest.h>

#include "helios/generate.h"
#include "helios/model_tools.h"
#include "test_paths.h"

namespace helios {
namespace {

// llama2.c's `run stories260K.bin -z tok512.bin -t 0` output (see tests/data/SOURCES.md).
constexpr const char* kReference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high";

struct Stories {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::unique_ptr<Model> model;

  static Stories& get() {
    static Stories s = [] {
      Stories st;
      const std::string dir = testing::test_data_dir() + "/stories260K/";
      const std::string out = testing::temp_dir() + "/stories260K.gguf";
      Status converted = convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", out);
      EXPECT_TRUE(converted.ok()) << converted.to_string();
      auto m = Model::load(out, *st.backend);
      EXPECT_TRUE(m.ok()) << m.status().to_string();
      if (m.ok()) st.model = std::move(*m);
      return st;
    }();
    return s;
  }
};

TEST(Stories260K, GreedyFromEmptyPromptIsTheReferenceText) {
  Model* m = Stories::get().model.get();
  ASSERT_NE(m, nullptr);
  const auto prompt = m->tokenizer().encode("", /*add_special=*/true, /*parse_special=*/false);
  ASSERT_EQ(prompt, std::vector<TokenId>{m->tokenizer().bos()});
  GenerateOptions opt;
  opt.max_tokens = 60;
  auto r = generate(*m, prompt, opt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // After BOS the first piece keeps SentencePiece's leading space (llama2.c strips it on print).
  ASSERT_FALSE(r->text.empty());
  EXPECT_EQ(r->text.substr(0, 1), " ");
  EXPECT_EQ(r->text.substr(1, std::string(kReference).size()), kReference);
}

TEST(Stories260K, TokenizerRoundTrips) {
  Model* m = Stories::get().model.get();
  ASSERT_NE(m, nullptr);
  const Tokenizer& tok = m->tokenizer();
  for (const std::string& text : {std::string(kReference), std::string("Tom and Sue's dog ran 3 miles!"),
                                 std::string("naïve café — 日本 🙂"), std::string("  two  spaces\nnewline")}) {
    const auto ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_FALSE(ids.empty());
    // The SentencePiece prefix space is removed again when decoding from the start.
    EXPECT_EQ(tok.decode(ids), text) << "ids: " << ids.size();
  }
  // Characters outside the 512-token vocabulary go through byte-fallback tokens.
  const auto emoji = tok.encode("🙂", false, false);
  EXPECT_GE(emoji.size(), 4u);
}

TEST(Stories260K, ConvertedModelHasTheCheckpointsShape) {
  Model* m = Stories::get().model.get();
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.n_layer, 5);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.n_ctx_train, 512);
  EXPECT_TRUE(c.tied_output);
}

TEST(Stories260K, ConverterRefusesATruncatedCheckpoint) {
  const std::string dir = testing::test_data_dir() + "/stories260K/";
  const std::string truncated = testing::temp_dir() + "/truncated.bin";
  {
    FILE* in = std::fopen((dir + "stories260K.bin").c_str(), "rb");
    FILE* out = std::fopen(truncated.c_str(), "wb");
    ASSERT_TRUE(in && out);
    std::vector<char> buf(100000);
    std::fwrite(buf.data(), 1, std::fread(buf.data(), 1, buf.size(), in), out);
    std::fclose(in);
    std::fclose(out);
  }
  Status s = convert_llama2c(truncated, dir + "tok512.bin", testing::temp_dir() + "/x.gguf");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("bytes"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace helios
