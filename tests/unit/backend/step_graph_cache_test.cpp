// The step-graph cache's decisions: run a new step, capture a repeated one, replay a captured
// one, push out the least recently used graph when full.
#include "backend/step_graph_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace helios {
namespace {

using Action = StepGraphCache::Action;

void* handle(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 * i)); }

TEST(StepGraphCache, RunsOnceThenCapturesThenReplays) {
  StepGraphCache cache(4);
  EXPECT_EQ(cache.decide("step a").action, Action::kRun);
  EXPECT_EQ(cache.decide("step b").action, Action::kRun);
  EXPECT_EQ(cache.decide("step a").action, Action::kCapture);
  EXPECT_EQ(cache.store("step a", handle(1)), nullptr);
  for (int i = 0; i < 3; ++i) {
    const auto d = cache.decide("step a");
    EXPECT_EQ(d.action, Action::kReplay);
    EXPECT_EQ(d.graph, handle(1));
  }
  EXPECT_EQ(cache.decide("step b").action, Action::kCapture);  // seen once before a's replays
}

TEST(StepGraphCache, KeysDifferingInOneByteAreDifferentSteps) {
  StepGraphCache cache(4);
  std::string key(4096, 'x');
  cache.decide(key);
  ASSERT_EQ(cache.decide(key).action, Action::kCapture);
  cache.store(key, handle(1));
  std::string other = key;
  other[2048] = 'y';
  EXPECT_EQ(cache.decide(other).action, Action::kRun);
  EXPECT_EQ(cache.decide(key).graph, handle(1));
}

TEST(StepGraphCache, FullCachePushesOutTheLeastRecentlyUsed) {
  StepGraphCache cache(2);
  for (const char* k : {"a", "b", "c"}) cache.decide(k);
  cache.decide("a");
  EXPECT_EQ(cache.store("a", handle(1)), nullptr);
  cache.decide("b");
  EXPECT_EQ(cache.store("b", handle(2)), nullptr);
  cache.decide("a");  // a is now more recent than b
  ASSERT_EQ(cache.decide("c").action, Action::kCapture);
  EXPECT_EQ(cache.store("c", handle(3)), handle(2));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.decide("a").action, Action::kReplay);
  EXPECT_EQ(cache.decide("b").action, Action::kRun);  // forgotten with its graph
  EXPECT_EQ(cache.decide("c").graph, handle(3));
}

TEST(StepGraphCache, StoringAKeyAgainReturnsTheOldGraph) {
  StepGraphCache cache(2);
  cache.decide("a");
  cache.decide("a");
  cache.store("a", handle(1));
  EXPECT_EQ(cache.store("a", handle(2)), handle(1));
  EXPECT_EQ(cache.decide("a").graph, handle(2));
}

TEST(StepGraphCache, ClearHandsBackEveryGraph) {
  StepGraphCache cache(4);
  for (const char* k : {"a", "b"}) {
    cache.decide(k);
    cache.decide(k);
  }
  cache.store("a", handle(1));
  cache.store("b", handle(2));
  auto all = cache.clear();
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<void*>{handle(1), handle(2)}));
  EXPECT_EQ(cache.decide("a").action, Action::kRun);  // seen keys are forgotten too
}

TEST(StepGraphCache, ZeroCapacityNeverCaptures) {
  StepGraphCache cache(0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cache.decide("a").action, Action::kRun);
}

}  // namespace
}  // namespace helios
