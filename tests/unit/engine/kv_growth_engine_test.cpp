// Growing an engine's KV pool at run time (Engine::grow_kv): a pool too small for two requests at
// once grows while both run, and they finish without a preemption, with the tokens of an engine
// started with the larger pool; an idle engine grows too; a smaller pool is refused; a growth that
// does not fit the device leaves the engine serving with the pool it had; and the
// helios_kv_blocks_total gauge follows every engine's pool from start to destruction.
#include <gtest/gtest.h>

#include <thread>

#include "unit/engine/engine_test_util.h"
#include "unit/model_setup/limited_backend.h"

namespace helios {
namespace {

using testing::drain;
using testing::engine_options;
using testing::kStoryPrompts;
using testing::make_generation;
using testing::Outcome;

// stories260K served from a LimitedBackend: every engine of these tests runs the same ops (one
// CPU thread), and one can be paused inside a pass.
struct OnLimited {
  testing::LimitedBackend backend{size_t{1} << 30};
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;

  explicit OnLimited(int32_t n_kv_blocks, MetricsRegistry* metrics = nullptr) {
    auto m = Model::load(testing::stories260k_path(), backend);
    if (!m.ok()) {
      ADD_FAILURE() << m.status().message();
      return;
    }
    model = std::move(*m);
    auto e = Engine::start(*model, engine_options(n_kv_blocks), metrics);
    EXPECT_TRUE(e.ok()) << e.status().message();
    if (e.ok()) engine = std::move(*e);
  }

  std::vector<std::shared_ptr<RequestStream>> submit_two() {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 2; ++i) {
      auto s = engine->submit(make_generation(*model, std::to_string(i), kStoryPrompts[i], {}, 0.0f, kMaxTokens));
      EXPECT_TRUE(s.ok()) << s.status().message();
      if (s.ok()) streams.push_back(*s);
    }
    return streams;
  }

  // Each request alone fits 6 blocks (96 tokens); the two together need about 130 tokens.
  static constexpr int32_t kMaxTokens = 60;
};

std::vector<std::vector<TokenId>> drain_ids(const std::vector<std::shared_ptr<RequestStream>>& streams) {
  std::vector<std::vector<TokenId>> ids;
  for (const auto& s : streams) {
    const Outcome o = drain(*s);
    EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
    ids.push_back(o.ids);
  }
  return ids;
}

// grow_kv is applied by the loop thread: true once status() shows the total.
bool wait_for_total(const Engine& engine, int32_t n_blocks) {
  for (int i = 0; i < 10000; ++i) {
    if (engine.status().kv_blocks_total == n_blocks) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(EngineKvGrowth, GrowsWhileRequestsRunAndTheyFinishAsOnTheLargerPool) {
  OnLimited roomy(16);
  const auto want = drain_ids(roomy.submit_two());
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(roomy.engine->status().preemptions, 0);

  // Control: on 6 blocks alone the two cannot both run to the end. The loop is held inside the
  // first request's first pass until the second has arrived, so the first cannot finish alone.
  OnLimited tight(6);
  tight.backend.pause_at_matmul(1);
  const auto tight_streams = tight.submit_two();
  tight.backend.wait_until_paused();
  tight.backend.resume();
  EXPECT_EQ(drain_ids(tight_streams), want);
  EXPECT_GT(tight.engine->status().preemptions, 0) << "the small pool was meant to run short";

  // The same, but the pool grows to 16 a few passes in, while both requests hold blocks. The
  // loop is held inside the first request's first pass until the second has arrived too.
  OnLimited grown(6);
  grown.backend.pause_at_matmul(1);
  const auto streams = grown.submit_two();
  grown.backend.wait_until_paused();
  grown.backend.pause_at_matmul(100);
  grown.backend.resume();
  grown.backend.wait_until_paused();
  const EngineStatus during = grown.engine->status();
  EXPECT_EQ(during.running, 2);
  EXPECT_GT(during.kv_blocks_used, 0);
  ASSERT_TRUE(grown.engine->grow_kv(16).ok());
  const Status below_pending = grown.engine->grow_kv(8);
  EXPECT_EQ(below_pending.code(), StatusCode::kInvalidArgument) << "8 is below the 16 already asked for";
  EXPECT_EQ(grown.engine->status().kv_blocks_total, 6) << "applied between steps, not inside one";
  grown.backend.resume();
  EXPECT_EQ(drain_ids(streams), want) << "the running sequences kept their blocks and K/V";
  const EngineStatus after = grown.engine->status();
  EXPECT_EQ(after.kv_blocks_total, 16);
  EXPECT_EQ(after.preemptions, 0) << "the grown pool held both";
  EXPECT_EQ(after.kv_blocks_used, 0);
}

TEST(EngineKvGrowth, AnIdleEngineGrowsAndTheGaugeFollowsEveryEngine) {
  MetricsRegistry registry;
  Gauge* gauge = registry.gauge("helios_kv_blocks_total", "KV cache blocks, all engines: follows the pool as it grows");
  auto a = std::make_unique<OnLimited>(8, &registry);
  EXPECT_EQ(gauge->value(), 8);
  auto b = std::make_unique<OnLimited>(4, &registry);
  EXPECT_EQ(gauge->value(), 12);

  ASSERT_TRUE(a->engine->grow_kv(20).ok());
  ASSERT_TRUE(wait_for_total(*a->engine, 20)) << "the idle loop applies it";
  EXPECT_EQ(gauge->value(), 24);
  EXPECT_NE(registry.render().find("helios_kv_blocks_total 24"), std::string::npos) << registry.render();

  const Status smaller = a->engine->grow_kv(19);
  EXPECT_EQ(smaller.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(smaller.message().find("20"), std::string::npos) << smaller.message();
  EXPECT_TRUE(a->engine->grow_kv(20).ok()) << "the size it has: nothing to do";
  EXPECT_EQ(a->engine->status().kv_blocks_total, 20);

  // The new blocks serve: a request that needs more than the 8 it started with.
  auto stream = a->engine->submit(make_generation(*a->model, "long", kStoryPrompts[0], {}, 0.0f, 200));
  ASSERT_TRUE(stream.ok());
  const Outcome o = drain(**stream);
  EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
  EXPECT_EQ(o.ids.size(), 200u);

  a.reset();
  EXPECT_EQ(gauge->value(), 4) << "a destroyed engine takes back its grown pool";
  b.reset();
  EXPECT_EQ(gauge->value(), 0);
}

TEST(EngineKvGrowth, AGrowthTheDeviceCannotHoldLeavesTheEngineServing) {
  OnLimited s(8);
  const int refused_before = s.backend.n_refused();
  ASSERT_TRUE(s.engine->grow_kv(int32_t{1} << 24).ok()) << "queued; the loop finds it does not fit";
  // The loop applies a growth before it admits what arrived after it, so by this request's end
  // the allocation has failed.
  auto stream = s.engine->submit(make_generation(*s.model, "after", kStoryPrompts[2], {}, 0.0f, 40));
  ASSERT_TRUE(stream.ok());
  const Outcome o = drain(**stream);
  EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
  EXPECT_EQ(o.ids.size(), 40u);
  EXPECT_GT(s.backend.n_refused(), refused_before);
  EXPECT_EQ(s.engine->status().kv_blocks_total, 8);
  EXPECT_TRUE(s.engine->fault().empty()) << s.engine->fault();

  // Nothing is left pending: a growth that fits goes through.
  ASSERT_TRUE(s.engine->grow_kv(12).ok());
  EXPECT_TRUE(wait_for_total(*s.engine, 12));
}

}  // namespace
}  // namespace helios
