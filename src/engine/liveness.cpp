#include "helios/liveness.h"

#include <algorithm>

namespace helios {

LivenessVerdict judge_liveness(bool work_pending, LivenessClock::time_point last_progress,
                               LivenessClock::time_point now, double timeout_s) {
  LivenessVerdict v;
  v.last_progress = last_progress;
  if (!work_pending) return v;
  // A clock read before the last step (samples taken on two threads) is no time at all.
  v.seconds_without_progress = std::max(0.0, std::chrono::duration<double>(now - last_progress).count());
  v.stalled = timeout_s > 0 && v.seconds_without_progress >= timeout_s;
  return v;
}

LivenessVerdict LivenessWatch::observe(const EngineProgress& progress, LivenessClock::time_point now,
                                       double timeout_s) {
  if (progress.work <= 0) idle_seen_ = now;
  return judge_liveness(progress.work > 0, std::max(progress.last_step, idle_seen_), now, timeout_s);
}

}  // namespace helios
