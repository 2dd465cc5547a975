// Metrics: counters, gauges and histograms in one registry that the daemon passes around (there
// is no global registry), rendered in Prometheus' text format and served over HTTP at /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "helios/status.h"

namespace helios {

using MetricLabels = std::map<std::string, std::string>;

class Counter {  // thread-safe
 public:
  void inc(double v = 1.0);
  double value() const;
 private:
  std::atomic<double> value_{0.0};
};

class Gauge {  // thread-safe
 public:
  void set(double v);
  void add(double v);
  double value() const;
 private:
  std::atomic<double> value_{0.0};
};

class Histogram {  // thread-safe; cumulative buckets with the given upper bounds (+Inf implied)
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class MetricsRegistry {  // registration and rendering are thread-safe
 public:
  // Declared here, defined in src/metrics/ where Family is complete (unique_ptr<Family>).
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  // The same name and labels return the same metric. Names follow Prometheus conventions
  // (helios_requests_running, helios_time_to_first_token_seconds, ..._total for counters).
  Counter* counter(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Gauge* gauge(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Histogram* histogram(const std::string& name, const std::string& help,
                       std::vector<double> upper_bounds, const MetricLabels& labels = {});
  // Prometheus text exposition format 0.0.4: # HELP / # TYPE per family, then its samples.
  std::string render() const;

 private:
  struct Family;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

// Serves GET /metrics (text/plain; version=0.0.4) from a registry on its own thread; other paths
// get 404. Stops on destruction.
class MetricsHttpServer {
 public:
  // listen: "HOST:PORT" (port 0 picks a free one; see port()).
  static StatusOr<std::unique_ptr<MetricsHttpServer>> start(const std::string& listen,
                                                            const MetricsRegistry& registry);
  virtual ~MetricsHttpServer() = default;
  virtual int port() const = 0;
};

}  // namespace helios
