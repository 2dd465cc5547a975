// The reader against a real model: SmolLM2-135M-Instruct Q4_1 as published (llama.cpp-made).
#include <gtest/gtest.h>

#include <filesystem>

#include "helios/gguf.h"
#include "test_paths.h"

namespace helios {
namespace {

TEST(GgufModelFile, SmolLM2HeaderAndTensorIndex) {
  const std::string path = testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/fetch_model.sh";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, TensorType::kQ8_0);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->n_bytes, 49152u * (576 / 32) * 34);
  const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->size(), 49152u);
  // Every tensor sits at an aligned offset from one common data section.
  const uint8_t* data_start = f.tensors()[0].data - f.tensors()[0].offset_bytes;
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset_bytes % f.alignment(), 0u) << t.name;
    EXPECT_EQ(t.data, data_start + t.offset_bytes) << t.name;
  }
}

}  // namespace
}  // namespace helios
