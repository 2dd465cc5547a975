// Liveness: the rule (judge_liveness, LivenessWatch) on chosen times, and the engine's progress
// counters on a real engine held inside a pass.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "helios/liveness.h"
#include "unit/engine/engine_test_util.h"
#include "unit/model_setup/limited_backend.h"

namespace helios {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const LivenessClock::time_point kT0 = LivenessClock::time_point(seconds(1000));

TEST(Liveness, WorkWithoutProgressPastTheTimeoutIsStalled) {
  const LivenessVerdict v = judge_liveness(true, kT0, kT0 + seconds(61), 60);
  EXPECT_TRUE(v.stalled);
  EXPECT_DOUBLE_EQ(v.seconds_without_progress, 61);
  EXPECT_TRUE(judge_liveness(true, kT0, kT0 + seconds(60), 60).stalled) << "the timeout itself counts";
}

TEST(Liveness, WithinTheTimeoutIsLive) {
  const LivenessVerdict v = judge_liveness(true, kT0, kT0 + milliseconds(59999), 60);
  EXPECT_FALSE(v.stalled);
  EXPECT_NEAR(v.seconds_without_progress, 59.999, 1e-9);
}

TEST(Liveness, NoWorkIsNeverStalled) {
  const LivenessVerdict v = judge_liveness(false, kT0, kT0 + seconds(3600), 60);
  EXPECT_FALSE(v.stalled);
  EXPECT_EQ(v.seconds_without_progress, 0);
}

TEST(Liveness, ATimeoutOfZeroIsOff) {
  EXPECT_FALSE(judge_liveness(true, kT0, kT0 + seconds(3600), 0).stalled);
  EXPECT_DOUBLE_EQ(judge_liveness(true, kT0, kT0 + seconds(3600), 0).seconds_without_progress, 3600);
}

TEST(Liveness, ProgressAfterNowIsNoTime) {
  // The step's clock was read after the watchdog's: not a negative duration.
  const LivenessVerdict v = judge_liveness(true, kT0 + seconds(1), kT0, 60);
  EXPECT_FALSE(v.stalled);
  EXPECT_EQ(v.seconds_without_progress, 0);
}

TEST(LivenessWatch, AnEngineIdleForLongIsNotStalledWhenWorkArrives) {
  LivenessWatch watch(kT0);
  EngineProgress p;
  p.last_step = kT0;  // its last step, an hour before the request
  EXPECT_FALSE(watch.observe(p, kT0 + seconds(3600), 60).stalled);  // idle: no work
  p.work = 1;
  const LivenessVerdict v = watch.observe(p, kT0 + seconds(3601), 60);
  EXPECT_FALSE(v.stalled);
  EXPECT_DOUBLE_EQ(v.seconds_without_progress, 1) << "counted from the last idle sample, not the last step";
  EXPECT_TRUE(watch.observe(p, kT0 + seconds(3661), 60).stalled);
}

TEST(LivenessWatch, StepsKeepItLiveAndStoppedStepsStallIt) {
  LivenessWatch watch(kT0);
  EngineProgress p;
  p.work = 3;
  for (int s = 1; s <= 200; ++s) {  // a step a second for 200 s
    p.steps = s;
    p.last_step = kT0 + seconds(s);
    ASSERT_FALSE(watch.observe(p, kT0 + seconds(s) + milliseconds(900), 60).stalled) << s;
  }
  // The steps stop: live until 60 s after the last one, stalled from then on.
  EXPECT_FALSE(watch.observe(p, kT0 + seconds(259), 60).stalled);
  EXPECT_TRUE(watch.observe(p, kT0 + seconds(260), 60).stalled);
  // A step completes: live again at once.
  p.steps = 201;
  p.last_step = kT0 + seconds(270);
  EXPECT_FALSE(watch.observe(p, kT0 + seconds(270) + milliseconds(1), 60).stalled);
}

TEST(LivenessWatch, WorkThatGoesAwayEndsAStall) {
  LivenessWatch watch(kT0);
  EngineProgress p;
  p.work = 1;
  EXPECT_TRUE(watch.observe(p, kT0 + seconds(61), 60).stalled);
  p.work = 0;
  EXPECT_FALSE(watch.observe(p, kT0 + seconds(62), 60).stalled);
  p.work = 1;  // new work: its own clock, from the idle sample
  EXPECT_FALSE(watch.observe(p, kT0 + seconds(63), 60).stalled);
}

// The counters a watchdog reads: no step completes while the loop is held inside a pass, work is
// pending meanwhile, and steps resume with the pass.
TEST(EngineProgressTest, StepsStopWhileAPassHangsAndResumeAfter) {
  testing::LimitedBackend backend(size_t{1} << 30);
  auto loaded = Model::load(testing::stories260k_path(), backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& model = **loaded;
  const auto before_start = LivenessClock::now();
  auto engine = Engine::start(model, testing::engine_options(64), nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const EngineProgress idle = (*engine)->progress();
  EXPECT_EQ(idle.steps, 0);
  EXPECT_EQ(idle.work, 0);
  EXPECT_GE(idle.last_step, before_start) << "no step yet: the start counts as the last progress";

  auto first = (*engine)->submit(testing::make_generation(model, "first", "Once upon a time", {}, 0.0f, 8));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(testing::drain(**first).ids.size(), 8u);
  const EngineProgress after_first = (*engine)->progress();
  // A prefill and 7 decodes; the last may still be counting when the client hears its token.
  EXPECT_GE(after_first.steps, 7);
  EXPECT_GE(after_first.last_step, idle.last_step);

  backend.pause_at_matmul(1);  // the next pass hangs in its first matmul
  auto held = (*engine)->submit(testing::make_generation(model, "held", "Lily and Tom", {}, 0.0f, 8));
  ASSERT_TRUE(held.ok());
  backend.wait_until_paused();
  const EngineProgress during = (*engine)->progress();
  std::this_thread::sleep_for(milliseconds(200));
  const EngineProgress later = (*engine)->progress();
  EXPECT_EQ(later.steps, during.steps) << "no step completes while the pass hangs";
  EXPECT_EQ(later.last_step, during.last_step);
  EXPECT_EQ(later.work, 1);
  LivenessWatch watch(during.last_step);
  EXPECT_TRUE(watch.observe(later, LivenessClock::now(), 0.1).stalled);

  backend.resume();
  EXPECT_EQ(testing::drain(**held).ids.size(), 8u);
  const EngineProgress done = (*engine)->progress();
  EXPECT_GE(done.steps, later.steps + 7);
  EXPECT_GT(done.last_step, later.last_step);
  EXPECT_EQ(done.work, 0);
  EXPECT_FALSE(watch.observe(done, LivenessClock::now(), 0.1).stalled);
}

}  // namespace
}  // namespace helios
