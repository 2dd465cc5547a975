// KvCacheStorage in f32 and f16: sizes, the layer views, and blocks that swap out and back in bit
// for bit (the engine's swap preemption moves raw words, whatever the element type).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "helios/kv_cache.h"

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
}

}  // namespace
}  // namespace helios
