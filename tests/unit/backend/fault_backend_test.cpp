// The fault-injecting backend (HELIOS_FAULTS): the spec it parses, the faults it injects, and that
// without a fault firing it computes exactly what the backend it wraps computes.
#if defined(HELIOS_FAULT_INJECTION)
#include "backend/fault_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using Clock = std::chrono::steady_clock;

TEST(FaultPlanParse, EachFault) {
  auto plan = parse_fault_plan("backend_error_after_matmuls=720");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->error_after_matmuls, 720);
  EXPECT_EQ(plan->stall_after_matmuls, -1);
  plan = parse_fault_plan(" stall_after_matmuls = 360:6.5 , backend_error_after_matmuls=0 ");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->stall_after_matmuls, 360);
  EXPECT_DOUBLE_EQ(plan->stall_seconds, 6.5);
  EXPECT_EQ(plan->error_after_matmuls, 0);
  EXPECT_EQ(plan->describe(), "device error after 0 matmuls; a 6.5 s stall after 360 matmuls");
  plan = parse_fault_plan("");
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
}

TEST(FaultPlanParse, AnUnknownFaultNamesTheValidOnes) {
  auto plan = parse_fault_plan("backend_error_after_matmuls=5,disk_full=1");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "unknown fault 'disk_full'; valid faults: backend_error_after_matmuls=N, stall_after_matmuls=N:SECONDS "
            "(comma-separated)");
}

TEST(FaultPlanParse, MalformedValuesNameTheForm) {
  for (const char* spec : {"backend_error_after_matmuls", "backend_error_after_matmuls=",
                           "backend_error_after_matmuls=-1", "backend_error_after_matmuls=ten",
                           "backend_error_after_matmuls=5x"}) {
    auto plan = parse_fault_plan(spec);
    ASSERT_FALSE(plan.ok()) << spec;
    EXPECT_NE(plan.status().message().find("expected =N"), std::string::npos) << plan.status().message();
  }
  for (const char* spec : {"stall_after_matmuls=5", "stall_after_matmuls=5:0", "stall_after_matmuls=5:-2",
                           "stall_after_matmuls=5:soon", "stall_after_matmuls=:3", "stall_after_matmuls=5:4000"}) {
    auto plan = parse_fault_plan(spec);
    ASSERT_FALSE(plan.ok()) << spec;
    EXPECT_NE(plan.status().message().find("expected =N:SECONDS"), std::string::npos) << plan.status().message();
  }
  auto twice = parse_fault_plan("stall_after_matmuls=1:1,stall_after_matmuls=2:1");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("given twice"), std::string::npos);
}

// A 2×2 F32 matmul in `backend`'s memory.
struct TinyMatmul {
  explicit TinyMatmul(Backend& b) : backend(b), w(&b, 4), x(&b, 2), y(&b, 2) {
    const float wh[4] = {1, 2, 3, 4}, xh[2] = {1, 1};
    b.upload(w.data(), wh, 4);
    b.upload(x.data(), xh, 2);
  }
  std::vector<float> run() {
    backend.matmul(x.data(), WeightMatrix{w.data(), TensorType::kF32, 2, 2}, 1, y.data());
    std::vector<float> out(2);
    backend.download(out.data(), y.data(), 2);
    return out;
  }
  Backend& backend;
  Buffer w, x, y;
};

TEST(FaultBackend, ADeviceErrorFromTheNthMatmulOnSticky) {
  FaultPlan plan;
  plan.error_after_matmuls = 3;
  auto backend = make_fault_backend(make_cpu_backend(1), plan);
  EXPECT_EQ(backend->name(), "cpu+faults");
  TinyMatmul m(*backend);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(m.run(), (std::vector<float>{3, 7}));
    EXPECT_TRUE(backend->error().ok()) << "after " << i + 1 << " matmuls";
  }
  m.run();
  const Status error = backend->error();
  EXPECT_EQ(error.code(), StatusCode::kInternal);
  EXPECT_EQ(error.message(), "injected device fault after 3 matmuls (HELIOS_FAULTS backend_error_after_matmuls)");
  m.run();
  EXPECT_FALSE(backend->error().ok()) << "a faulted device stays faulted";
}

TEST(FaultBackend, NothingCountsUntilArmed) {
  FaultPlan plan;
  plan.error_after_matmuls = 2;
  auto trigger = std::make_shared<FaultTrigger>();
  auto backend = make_fault_backend(make_cpu_backend(1), plan, trigger);
  TinyMatmul m(*backend);
  for (int i = 0; i < 5; ++i) m.run();  // loading and start-up profiles, say
  EXPECT_TRUE(backend->error().ok());
  trigger->armed = true;
  m.run();
  EXPECT_TRUE(backend->error().ok()) << "one matmul since armed";
  m.run();
  EXPECT_FALSE(backend->error().ok()) << "two since armed";
}

TEST(FaultBackend, AStallBlocksOneMatmulOnce) {
  FaultPlan plan;
  plan.stall_after_matmuls = 2;
  plan.stall_seconds = 0.3;
  auto backend = make_fault_backend(make_cpu_backend(1), plan);
  TinyMatmul m(*backend);
  std::vector<double> took;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    EXPECT_EQ(m.run(), (std::vector<float>{3, 7}));
    took.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  EXPECT_LT(took[0], 0.2);
  EXPECT_LT(took[1], 0.2);
  EXPECT_GE(took[2], 0.3) << "the third matmul stalls";
  EXPECT_LT(took[3], 0.2) << "once";
  EXPECT_TRUE(backend->error().ok()) << "a stall is no error";
}

// Greedy tokens of one prompt from an engine on `backend`.
std::vector<TokenId> generate_on(Backend& backend, int32_t max_tokens) {
  auto model = Model::load(testing::stories260k_path(), backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  auto engine = Engine::start(**model, testing::engine_options(64), nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return {};
  auto stream = (*engine)->submit(testing::make_generation(**model, "r", "Once upon a time", {}, 0.0f, max_tokens));
  EXPECT_TRUE(stream.ok());
  const testing::Outcome o = testing::drain(**stream);
  EXPECT_EQ(o.error, "");
  return o.ids;
}

TEST(FaultBackend, WithoutAFaultFiringItComputesWhatItWraps) {
  auto plain = make_cpu_backend(2);
  FaultPlan late;  // armed, but past this test's matmuls
  late.error_after_matmuls = 1 << 30;
  late.stall_after_matmuls = 1 << 30;
  late.stall_seconds = 1;
  auto wrapped = make_fault_backend(make_cpu_backend(2), late);
  const std::vector<TokenId> want = generate_on(*plain, 24);
  ASSERT_EQ(want.size(), 24u);
  EXPECT_EQ(generate_on(*wrapped, 24), want);
}

TEST(FaultBackend, AnEngineOnItFailsTheRequestsWithTheInjectedError) {
  FaultPlan plan;
  plan.error_after_matmuls = 200;  // a few passes of stories260K's 5 layers
  auto backend = make_fault_backend(make_cpu_backend(2), plan);
  auto model = Model::load(testing::stories260k_path(), *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::string reported;
  EngineOptions options = testing::engine_options(64);
  options.on_fault = [&](const std::string& error) { reported = error; };
  auto engine = Engine::start(**model, options, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto stream = (*engine)->submit(testing::make_generation(**model, "r", "Once upon a time", {}, 0.0f, 100));
  ASSERT_TRUE(stream.ok());
  const testing::Outcome o = testing::drain(**stream);
  EXPECT_EQ(o.finish, FinishReason::kAborted);
  EXPECT_EQ(o.error_code, StatusCode::kInternal);
  EXPECT_NE(o.error.find("injected device fault after 200 matmuls"), std::string::npos) << o.error;
  EXPECT_GT(o.ids.size(), 0u);
  EXPECT_LT(o.ids.size(), 100u);
  EXPECT_NE(reported.find("injected device fault"), std::string::npos) << reported;
}

}  // namespace
}  // namespace helios
#endif  // HELIOS_FAULT_INJECTION
