// The liveness watchdog: samples every engine's progress on its own thread and applies the rule
// of helios/liveness.h. An engine with work and no step completed for server.liveness_timeout_s is
// stalled: logged with its name and for how long, shown in metrics, and reported to the server,
// which keeps health NOT_SERVING while any engine is stalled. When its steps resume it is live
// again.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "helios/liveness.h"
#include "helios/metrics.h"

namespace helios::server {

struct EngineSample {
  std::string name;  // a model's name, or "group/model@depth" for a group's engine
  // nullopt: the engines named `name...` could not be read this time (a group busy loading);
  // their state stays as it was.
  std::optional<EngineProgress> progress;
};

class LivenessWatchdog {
 public:
  // Starts the thread. `sample` lists the engines (called from the watchdog thread only);
  // `on_change(any_stalled)` runs there whenever the set of stalled engines changes.
  LivenessWatchdog(double timeout_s, MetricsRegistry& metrics, std::function<std::vector<EngineSample>()> sample,
                   std::function<void(bool any_stalled)> on_change);
  ~LivenessWatchdog();  // stops and joins the thread

 private:
  struct Watched {
    explicit Watched(LivenessClock::time_point now) : watch(now) {}
    LivenessWatch watch;
    bool stalled = false;
    double logged_at_s = 0;  // seconds without progress when the stall was last logged
    LivenessClock::time_point progress_before_stall{};  // the last progress before the stall
    Gauge* stalled_gauge = nullptr;
    Gauge* seconds_gauge = nullptr;
    Counter* stalls = nullptr;
  };
  Watched& watched(const std::string& name, LivenessClock::time_point now);
  void forget(std::map<std::string, Watched>::iterator it);
  void check(LivenessClock::time_point now);  // one pass over the engines
  void run();

  double timeout_s_;
  MetricsRegistry& metrics_;
  std::function<std::vector<EngineSample>()> sample_;
  std::function<void(bool)> on_change_;
  std::map<std::string, Watched> engines_;  // watchdog thread only
  size_t n_stalled_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace helios::server
