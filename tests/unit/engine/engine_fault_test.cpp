// A device error fails loudly: the requests of the step get INTERNAL naming the failure, the
// engine reports the fault (on_fault, fault()) and refuses new work, and no request gets a token
// computed on the faulted device.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "unit/engine/engine_test_util.h"
#include "unit/model_setup/limited_backend.h"

namespace helios {
namespace {

using testing::drain;
using testing::make_generation;

TEST(EngineFault, ADeviceErrorFailsTheRequestsAndFaultsTheEngine) {
  testing::LimitedBackend backend(size_t{1} << 30);
  auto loaded = Model::load(testing::stories260k_path(), backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& model = **loaded;
  std::atomic<int> faults{0};
  std::string reported;
  EngineOptions options = testing::engine_options(64);
  options.on_fault = [&](const std::string& error) {
    reported = error;
    ++faults;
  };
  auto engine = Engine::start(model, options, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status().message();

  // One request runs cleanly first.
  auto before = (*engine)->submit(make_generation(model, "before", "Once upon a time", {}, 0.0f, 8));
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(drain(**before).ids.size(), 8u);

  // The device fails during the next requests' decode.
  backend.fail_after_matmuls(5 * 7 * 3);  // a few passes in
  auto a = (*engine)->submit(make_generation(model, "a", "Lily and Tom", {}, 0.0f, 40));
  auto b = (*engine)->submit(make_generation(model, "b", "The little dog ran", {}, 0.0f, 40));
  ASSERT_TRUE(a.ok()) << a.status().message();
  // The engine may step on `a` into the fault before `b` arrives: then `b` is refused, naming it.
  std::vector<std::shared_ptr<RequestStream>> streams = {*a};
  if (b.ok()) {
    streams.push_back(*b);
  } else {
    EXPECT_EQ(b.status().code(), StatusCode::kInternal);
    EXPECT_NE(b.status().message().find("injected device fault"), std::string::npos) << b.status().message();
  }
  for (const auto& stream : streams) {
    const testing::Outcome o = drain(*stream);
    EXPECT_EQ(o.finish, FinishReason::kAborted);
    EXPECT_EQ(o.error_code, StatusCode::kInternal);
    EXPECT_NE(o.error.find("injected device fault in matmul"), std::string::npos) << o.error;
    EXPECT_LT(o.ids.size(), 40u) << "tokens stop at the fault";
  }
  EXPECT_EQ(faults.load(), 1);
  EXPECT_NE(reported.find("injected device fault"), std::string::npos) << reported;
  EXPECT_NE((*engine)->fault().find("injected device fault"), std::string::npos);

  // A faulted engine takes no more work.
  auto after = (*engine)->submit(make_generation(model, "after", "One day", {}, 0.0f, 8));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kInternal);
}

TEST(EngineFault, AFaultedBackendNeverRunsAForwardPass) {
  testing::LimitedBackend backend(size_t{1} << 30);
  auto loaded = Model::load(testing::stories260k_path(), backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  backend.fail_after_matmuls(0);
  auto kv = KvCacheStorage::create(backend, (*loaded)->kv_config(), 4, 16);
  ASSERT_TRUE(kv.ok());
  BlockAllocator blocks(4);
  BlockTable table;
  ASSERT_TRUE(reserve_tokens(blocks, table, 16, 16));
  ForwardBatch batch;
  SequenceBatchEntry e;
  e.tokens = {1, 2, 3};
  e.blocks = &table;
  batch.seqs.push_back(e);
  const auto fr = (*loaded)->forward(batch, *kv);
  ASSERT_FALSE(fr.ok());
  EXPECT_EQ(fr.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace helios
