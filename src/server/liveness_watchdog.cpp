#include "server/liveness_watchdog.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace helios::server {

LivenessWatchdog::LivenessWatchdog(double timeout_s, MetricsRegistry& metrics,
                                   std::function<std::vector<EngineSample>()> sample,
                                   std::function<void(bool)> on_change)
    : timeout_s_(timeout_s), metrics_(metrics), sample_(std::move(sample)), on_change_(std::move(on_change)),
      thread_([this] { run(); }) {}

LivenessWatchdog::~LivenessWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LivenessWatchdog::run() {
  // A few looks per timeout: a stall shows within about timeout × 1.25, and a short timeout
  // (tests) still gets a fine tick without spinning.
  const auto tick = std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.05, 1.0));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, tick, [&] { return stop_; })) {
    lock.unlock();
    check(LivenessClock::now());
    lock.lock();
  }
}

LivenessWatchdog::Watched& LivenessWatchdog::watched(const std::string& name, LivenessClock::time_point now) {
  auto it = engines_.find(name);
  if (it != engines_.end()) return it->second;
  Watched& w = engines_.emplace(name, Watched(now)).first->second;
  const MetricLabels labels{{"model", name}};
  w.stalled_gauge = metrics_.gauge("helios_engine_stalled",
                                   "1 while the model has work and its engine completes no step "
                                   "(server.liveness_timeout_s)", labels);
  w.seconds_gauge = metrics_.gauge("helios_engine_seconds_without_step",
                                   "Seconds the model has had work without completing an engine step (0: none)",
                                   labels);
  w.stalls = metrics_.counter("helios_engine_stalls_total", "Times the model's engine was found stalled", labels);
  return w;
}

void LivenessWatchdog::forget(std::map<std::string, Watched>::iterator it) {
  if (it->second.stalled) {
    --n_stalled_;
    spdlog::warn("{}: stalled engine removed (its model was released)", it->first);
  }
  it->second.stalled_gauge->set(0);
  it->second.seconds_gauge->set(0);
  engines_.erase(it);
}

void LivenessWatchdog::check(LivenessClock::time_point now) {
  const size_t stalled_before = n_stalled_;
  std::vector<std::string> seen, kept;  // kept: prefixes of engines that could not be read
  for (const EngineSample& s : sample_()) {
    if (!s.progress) {
      kept.push_back(s.name);
      continue;
    }
    seen.push_back(s.name);
    Watched& w = watched(s.name, now);
    const LivenessVerdict v = w.watch.observe(*s.progress, now, timeout_s_);
    w.seconds_gauge->set(v.seconds_without_progress);
    if (v.stalled && !w.stalled) {
      w.stalled = true;
      ++n_stalled_;
      w.logged_at_s = v.seconds_without_progress;
      w.progress_before_stall = v.last_progress;
      w.stalls->inc();
      w.stalled_gauge->set(1);
      spdlog::error("{}: stalled: no engine step completed in {:.1f} s with {} request(s) queued or running "
                    "(server.liveness_timeout_s {:g}); health NOT_SERVING until its steps resume",
                    s.name, v.seconds_without_progress, s.progress->work, timeout_s_);
    } else if (v.stalled && v.seconds_without_progress >= w.logged_at_s + std::max(timeout_s_, 10.0)) {
      w.logged_at_s = v.seconds_without_progress;
      spdlog::error("{}: still stalled: no engine step in {:.0f} s, {} request(s) queued or running", s.name,
                    v.seconds_without_progress, s.progress->work);
    } else if (!v.stalled && w.stalled) {
      w.stalled = false;
      --n_stalled_;
      w.stalled_gauge->set(0);
      if (s.progress->last_step > w.progress_before_stall) {
        spdlog::warn("{}: engine steps resumed after {:.1f} s without one; {} step(s) completed so far", s.name,
                     std::chrono::duration<double>(s.progress->last_step - w.progress_before_stall).count(),
                     s.progress->steps);
      } else {  // no step, but nothing left to do (its requests ended)
        spdlog::warn("{}: no longer stalled: no work left after {:.1f} s without a step", s.name,
                     std::chrono::duration<double>(now - w.progress_before_stall).count());
      }
    }
  }
  for (auto it = engines_.begin(); it != engines_.end();) {
    const std::string& name = it->first;
    const bool listed =
        std::find(seen.begin(), seen.end(), name) != seen.end() ||
        std::any_of(kept.begin(), kept.end(), [&](const std::string& prefix) { return name.starts_with(prefix); });
    if (listed) {
      ++it;
    } else {
      forget(it++);
    }
  }
  if ((stalled_before == 0) != (n_stalled_ == 0)) on_change_(n_stalled_ > 0);
}

}  // namespace helios::server
