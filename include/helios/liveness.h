// Liveness: is an engine that has work still completing steps? A process can answer health
// checks while its engine loop is wedged (a hung kernel, a deadlock); the server's watchdog
// turns that into NOT_SERVING with this rule.
#pragma once

#include <chrono>
#include <cstdint>

namespace helios {

using LivenessClock = std::chrono::steady_clock;

// Progress of one engine loop (Engine::progress()).
struct EngineProgress {
  int64_t steps = 0;                      // forward steps completed since the engine started
  LivenessClock::time_point last_step{};  // when the last one completed (none yet: the start)
  int32_t work = 0;                       // requests queued, running or swapped out (not paused)
};

struct LivenessVerdict {
  bool stalled = false;
  double seconds_without_progress = 0;    // 0 when there is no work
  LivenessClock::time_point last_progress{};  // what they are counted from
};

// The rule. `last_progress`: the later of the last completed step and the last moment the engine
// had no work (time without work is not a stall). Stalled when work is pending and nothing has
// progressed for `timeout_s` seconds; a timeout of 0 or less never stalls.
LivenessVerdict judge_liveness(bool work_pending, LivenessClock::time_point last_progress,
                               LivenessClock::time_point now, double timeout_s);

// The rule applied to one engine's progress, sampled over time: remembers the last sample that
// saw no work, so that an engine idle for an hour is not stalled the moment a request arrives.
class LivenessWatch {
 public:
  explicit LivenessWatch(LivenessClock::time_point now) : idle_seen_(now) {}
  LivenessVerdict observe(const EngineProgress& progress, LivenessClock::time_point now, double timeout_s);

 private:
  LivenessClock::time_point idle_seen_;
};

}  // namespace helios
