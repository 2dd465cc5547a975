// The KV cache's size (configured bytes or a fraction of the memory, shared by the models, only
// loaded layers) and plan_engine's order: activations first, the KV cache from what is left.
#include <gtest/gtest.h>

#include "helios/model_setup.h"
#include "unit/model_setup/limited_backend.h"
#include "test_paths.h"

namespace helios {
namespace {

ModelConfig config_with_layers(int32_t n_layer) {
  ModelConfig c;
  c.n_layer = n_layer;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_head_kv = 4;
  c.head_dim = 8;
  return c;
}

TEST(SizeKvCache, F16BlocksAreHalfTheBytes) {
  EngineConfig engine;
  engine.kv_cache_bytes = 1 << 20;
  const ModelConfig c = config_with_layers(4);
  auto f32 = size_kv_cache(engine, c, 1, 0, "m", kernels::KvType::kF32);
  auto f16 = size_kv_cache(engine, c, 1, 0, "m", kernels::KvType::kF16);
  ASSERT_TRUE(f32.ok() && f16.ok());
  EXPECT_EQ(f16->bytes_per_block * 2, f32->bytes_per_block);
  EXPECT_EQ(f16->n_blocks, 2 * f32->n_blocks);
}

TEST(ResolveKvType, AutoIsF16WhereTheBackendHasIt) {
  EngineConfig engine;
  const auto cpu = make_cpu_backend(1);
  auto type = resolve_kv_type(engine, *cpu);
  ASSERT_TRUE(type.ok());
  EXPECT_EQ(*type, kernels::KvType::kF16);
  engine.kv_cache_type = kernels::KvType::kF32;
  EXPECT_EQ(*resolve_kv_type(engine, *cpu), kernels::KvType::kF32);
}

TEST(ResolveKvType, ABackendWithoutF16GetsF32OrAClearError) {
  testing::LimitedBackend f32_only(1 << 20);  // takes f32 caches only, as the CUDA backend today
  EngineConfig engine;
  EXPECT_EQ(*resolve_kv_type(engine, f32_only), kernels::KvType::kF32);
  engine.kv_cache_type = kernels::KvType::kF16;
  auto refused = resolve_kv_type(engine, f32_only);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("engine.kv_cache_type"), std::string::npos);
  EXPECT_NE(refused.status().message().find("f32"), std::string::npos);
}

TEST(SizeKvCache, ConfiguredBytesSharedByTheModels) {
  EngineConfig engine;
  engine.block_size = 16;
  engine.kv_cache_bytes = 10 << 20;
  const ModelConfig c = config_with_layers(4);
  const int64_t per_block = KvCacheStorage::bytes_per_block(c, 16);
  EXPECT_EQ(per_block, 2LL * 4 * 16 * 32 * 4);
  auto one = size_kv_cache(engine, c, 1, 123, "m");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->bytes, 10 << 20);  // the memory size is not read
  EXPECT_EQ(one->bytes_per_block, per_block);
  EXPECT_EQ(one->n_blocks, (10 << 20) / per_block);
  // Recompute mode too: intercepts swap paused KV to host.
  EXPECT_EQ(one->n_swap_blocks, engine.swap_space_bytes / per_block);

  auto two = size_kv_cache(engine, c, 2, 123, "m");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->bytes, 5 << 20);
  EXPECT_EQ(two->n_blocks, (5 << 20) / per_block);
}

TEST(SizeKvCache, FractionOfTheMemoryWhenNoBytesAreSet) {
  EngineConfig engine;
  engine.kv_cache_bytes = 0;
  engine.kv_cache_fraction = 0.25;
  const ModelConfig c = config_with_layers(4);
  auto kv = size_kv_cache(engine, c, 1, 64 << 20, "m");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->bytes, 16 << 20);
  EXPECT_EQ(kv->n_blocks, (16 << 20) / kv->bytes_per_block);
}

TEST(SizeKvCache, OnlyLoadedLayersHoldKv) {
  EngineConfig engine;
  engine.kv_cache_bytes = 1 << 20;
  auto all = size_kv_cache(engine, config_with_layers(4), 1, 0, "m");
  auto half = size_kv_cache(engine, config_with_layers(2), 1, 0, "m");
  ASSERT_TRUE(all.ok() && half.ok());
  EXPECT_EQ(half->bytes_per_block * 2, all->bytes_per_block);
  EXPECT_EQ(half->n_blocks, 2 * all->n_blocks);
}

TEST(SizeKvCache, SwapBlocksInSwapMode) {
  EngineConfig engine;
  engine.kv_cache_bytes = 1 << 20;
  engine.preemption = PreemptionMode::kSwap;
  engine.swap_space_bytes = 4 << 20;
  auto kv = size_kv_cache(engine, config_with_layers(4), 2, 0, "m");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->n_swap_blocks, (2 << 20) / kv->bytes_per_block);
}

TEST(SizeKvCache, LessThanOneBlockIsRefused) {
  EngineConfig engine;
  engine.kv_cache_bytes = 1000;
  auto kv = size_kv_cache(engine, config_with_layers(4), 2, 0, "tiny");
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.status().message(), "engine.kv_cache (500 bytes for model 'tiny') is smaller than one KV block (16384 "
                                   "bytes); give it more memory");
}

// On a device with 8 MiB, the KV cache takes all that is left after the weights and the
// activations for max_batched_tokens: the cache can then be created, and a pass of that many
// tokens allocates nothing more.
TEST(PlanEngine, ActivationsAreAllocatedBeforeTheKvCacheIsSized) {
  testing::LimitedBackend backend(8 << 20);
  auto model = Model::load(testing::stories260k_path(), backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const size_t after_weights = backend.free_device_bytes();
  EngineConfig engine;
  engine.kv_cache_bytes = 0;
  engine.kv_cache_fraction = 1.0;
  engine.block_size = 16;
  engine.max_batched_tokens = 64;
  auto options = plan_engine(engine, **model, 1, "stories");
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  const size_t after_activations = backend.free_device_bytes();
  EXPECT_LT(after_activations, after_weights);
  const int64_t per_block = KvCacheStorage::bytes_per_block((*model)->kv_config(), 16);
  EXPECT_EQ(options->n_kv_blocks, static_cast<int64_t>(after_activations) / per_block);
  EXPECT_EQ(options->scheduler.max_batched_tokens, 64);

  auto kv = KvCacheStorage::create(backend, (*model)->kv_config(), options->n_kv_blocks, 16);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  BlockAllocator allocator(options->n_kv_blocks);
  BlockTable table;
  ASSERT_TRUE(reserve_tokens(allocator, table, 64, 16));
  ForwardBatch batch;
  SequenceBatchEntry e;
  for (int32_t i = 0; i < 64; ++i) e.tokens.push_back(1 + i);
  e.blocks = &table;
  e.logits = LogitsWanted::kAll;
  batch.seqs.push_back(e);
  const size_t before_pass = backend.used_bytes();
  auto result = (*model)->forward(batch, *kv);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(backend.used_bytes(), before_pass);
  EXPECT_EQ(backend.n_refused(), 0);
}

TEST(PlanEngine, ActivationsThatDoNotFitAreAnError) {
  testing::LimitedBackend backend(2 << 20);
  auto model = Model::load(testing::stories260k_path(), backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EngineConfig engine;
  engine.max_batched_tokens = 1 << 16;  // logits alone: 128 MiB
  auto options = plan_engine(engine, **model, 1, "stories");
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), StatusCode::kResourceExhausted) << options.status().to_string();
  // The model still runs the batches that fit.
  engine.max_batched_tokens = 16;
  engine.kv_cache_bytes = 64 << 10;
  EXPECT_TRUE(plan_engine(engine, **model, 1, "stories").ok());
}

}  // namespace
}  // namespace helios
