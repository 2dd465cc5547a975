// KvCacheStorage in f32 and f16: sizes, the layer views, and blocks that swap out and back in bit
// for bit (the engine's swap preemption moves raw words, whatever the element type).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "helios/kv_cache.h"
#include "unit/model_setup/limited_backend.h"

namespace helios {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 8;
  return c;
}

TEST(KvCacheStorage, F16HalvesTheBytesAndSwapsBitForBit) {
  const ModelConfig c = small_config();
  const auto backend = make_cpu_backend(1);
  EXPECT_EQ(KvCacheStorage::bytes_per_block(c, 4, kernels::KvType::kF16) * 2,
            KvCacheStorage::bytes_per_block(c, 4, kernels::KvType::kF32));
  auto a = KvCacheStorage::create(*backend, c, 5, 4, kernels::KvType::kF16);
  auto b = KvCacheStorage::create(*backend, c, 5, 4, kernels::KvType::kF16);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(a->type(), kernels::KvType::kF16);
  EXPECT_EQ(a->layer(1).type, kernels::KvType::kF16);
  // A block is block_size × kv_dim halves per layer for K and for V: 4 × 16 / 2 words each.
  EXPECT_EQ(a->words_per_block(), 2 * 3 * 4 * 16 / 2);

  // Tokens written into block 3 of `a` through kv_write, swapped out, swapped into block 1 of `b`.
  std::vector<float> k(4 * 16), v(4 * 16);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.37f * static_cast<float>(i) - 9.0f;
    v[i] = -0.11f * static_cast<float>(i);
  }
  const int32_t slots[4] = {12, 13, 14, 15};  // block 3
  for (int32_t l = 0; l < c.n_layer; ++l) kernels::ref_kv_write(k.data(), v.data(), slots, 4, a->layer(l));
  std::vector<float> host(a->words_per_block());
  a->read_block(3, host.data());
  b->write_block(1, host.data());
  const size_t block_bytes = 4 * 16 * sizeof(uint16_t);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const auto* ka = static_cast<const uint8_t*>(a->layer(l).k) + 3 * block_bytes;
    const auto* kb = static_cast<const uint8_t*>(b->layer(l).k) + 1 * block_bytes;
    const auto* va = static_cast<const uint8_t*>(a->layer(l).v) + 3 * block_bytes;
    const auto* vb = static_cast<const uint8_t*>(b->layer(l).v) + 1 * block_bytes;
    EXPECT_EQ(std::memcmp(ka, kb, block_bytes), 0) << "layer " << l;
    EXPECT_EQ(std::memcmp(va, vb, block_bytes), 0) << "layer " << l;
  }
}

TEST(KvCacheStorage, RefusesAnOddF16Block) {
  ModelConfig c = small_config();
  c.n_head_kv = 1;
  c.head_dim = 3;
  const auto backend = make_cpu_backend(1);
  auto odd = KvCacheStorage::create(*backend, c, 2, 1, kernels::KvType::kF16);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("kv_cache_type"), std::string::npos) << odd.status().message();
  EXPECT_TRUE(KvCacheStorage::create(*backend, c, 2, 1, kernels::KvType::kF32).ok());
  // fp8: four values to a swapped word.
  c.head_dim = 2;
  auto two = KvCacheStorage::create(*backend, c, 2, 1, kernels::KvType::kFp8E4M3);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("multiple of 4"), std::string::npos) << two.status().message();
  EXPECT_TRUE(KvCacheStorage::create(*backend, c, 2, 2, kernels::KvType::kFp8E4M3).ok());
  EXPECT_EQ(KvCacheStorage::bytes_per_block(small_config(), 4, kernels::KvType::kFp8E4M3) * 4,
            KvCacheStorage::bytes_per_block(small_config(), 4, kernels::KvType::kF32));
}

// Block b of `kv` filled with a pattern of its own through write_block.
std::vector<float> fill_block(KvCacheStorage& kv, int32_t b) {
  std::vector<float> words(kv.words_per_block());
  for (size_t i = 0; i < words.size(); ++i) words[i] = 1000.0f * static_cast<float>(b) + 0.25f * static_cast<float>(i);
  kv.write_block(b, words.data());
  return words;
}

std::vector<float> read_block(const KvCacheStorage& kv, int32_t b) {
  std::vector<float> words(kv.words_per_block());
  kv.read_block(b, words.data());
  return words;
}

TEST(KvCacheStorage, GrowKeepsEveryBlockAndTheNewBlocksWork) {
  const ModelConfig c = small_config();
  const auto backend = make_cpu_backend(1);
  for (kernels::KvType type : {kernels::KvType::kF32, kernels::KvType::kF16, kernels::KvType::kFp8E4M3}) {
    auto kv = KvCacheStorage::create(*backend, c, 3, 4, type);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    std::vector<std::vector<float>> before;
    for (int32_t b = 0; b < 3; ++b) before.push_back(fill_block(*kv, b));

    ASSERT_TRUE(kv->grow(7).ok());
    EXPECT_EQ(kv->n_blocks(), 7);
    for (int32_t l = 0; l < c.n_layer; ++l) EXPECT_EQ(kv->layer(l).n_blocks, 7);
    // Bit for bit: the words compare as bytes (f16 pairs are not floats).
    for (int32_t b = 0; b < 3; ++b) {
      EXPECT_EQ(std::memcmp(read_block(*kv, b).data(), before[b].data(), before[b].size() * 4), 0) << "block " << b;
    }
    for (int32_t b = 3; b < 7; ++b) {
      const std::vector<float> words = fill_block(*kv, b);
      EXPECT_EQ(std::memcmp(read_block(*kv, b).data(), words.data(), words.size() * 4), 0) << "block " << b;
    }
    // kv_write reaches the last new block; the old blocks are untouched by it.
    std::vector<float> k(c.kv_dim(), 1.5f), v(c.kv_dim(), -2.5f);
    const int32_t slot = 6 * 4 + 3;
    kernels::ref_kv_write(k.data(), v.data(), &slot, 1, kv->layer(2));
    EXPECT_EQ(std::memcmp(read_block(*kv, 0).data(), before[0].data(), before[0].size() * 4), 0);
    if (type == kernels::KvType::kF32) {
      EXPECT_EQ(static_cast<const float*>(kv->layer(2).k)[slot * c.kv_dim()], 1.5f);
      EXPECT_EQ(static_cast<const float*>(kv->layer(2).v)[slot * c.kv_dim()], -2.5f);
    }
  }
}

TEST(KvCacheStorage, GrowRefusesFewerBlocksAndIsANoOpAtTheSameCount) {
  const auto backend = make_cpu_backend(1);
  auto kv = KvCacheStorage::create(*backend, small_config(), 4, 4);
  ASSERT_TRUE(kv.ok());
  const std::vector<float> words = fill_block(*kv, 2);
  const Status smaller = kv->grow(3);
  EXPECT_EQ(smaller.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(kv->grow(4).ok());
  EXPECT_EQ(kv->n_blocks(), 4);
  EXPECT_EQ(read_block(*kv, 2), words);
}

TEST(KvCacheStorage, AGrowthThatDoesNotFitLeavesTheCacheAsItWas) {
  const ModelConfig c = small_config();
  const int64_t block_bytes = KvCacheStorage::bytes_per_block(c, 4);
  // Room for 3 blocks and then 5 more: not for 3 old plus 10 new while the old are held.
  testing::LimitedBackend backend(static_cast<size_t>(8 * block_bytes));
  auto kv = KvCacheStorage::create(backend, c, 3, 4);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  const std::vector<float> words = fill_block(*kv, 1);
  const size_t used = backend.used_bytes();
  const void* k0 = kv->layer(0).k;

  const Status st = kv->grow(10);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find(std::to_string(10 * block_bytes) + " bytes"), std::string::npos) << st.message();
  EXPECT_EQ(kv->n_blocks(), 3);
  EXPECT_EQ(kv->layer(0).k, k0);
  EXPECT_EQ(backend.used_bytes(), used) << "the buffers allocated before the failure were freed";
  EXPECT_EQ(read_block(*kv, 1), words);

  ASSERT_TRUE(kv->grow(5).ok()) << "3 old and 5 new blocks fit";
  EXPECT_EQ(read_block(*kv, 1), words);
  EXPECT_EQ(backend.used_bytes(), static_cast<size_t>(5 * block_bytes)) << "the old storage was freed";
}

}  // namespace
}  // namespace helios
