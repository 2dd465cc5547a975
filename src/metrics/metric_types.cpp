// Counter, Gauge and Histogram: the values the registry hands out.
#include <algorithm>
#include <cmath>

#include "helios/metrics.h"

namespace helios {

namespace {
// std::atomic<double>::fetch_add is C++20 but not lock-free everywhere; a CAS loop is.
void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}
}  // namespace

// Counters only go up: negative and NaN increments are ignored (a Prometheus counter that
// decreases reads as a restart and corrupts rate()).
void Counter::inc(double v) {
  if (!(v >= 0)) return;
  atomic_add(value_, v);
}
double Counter::value() const { return value_.load(std::memory_order_relaxed); }

void Gauge::set(double v) { value_.store(v, std::memory_order_relaxed); }
void Gauge::add(double v) { atomic_add(value_, v); }
double Gauge::value() const { return value_.load(std::memory_order_relaxed); }

// Bounds are cleaned up rather than rejected (a constructor cannot return a Status): non-finite
// bounds are dropped (+Inf is always implied), the rest sorted and de-duplicated. The registry's
// histogram() is stricter and returns nullptr for bounds that need this cleanup.
Histogram::Histogram(std::vector<double> upper_bounds) {
  for (double b : upper_bounds) {
    if (std::isfinite(b)) bounds_.push_back(b);
  }
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  counts_.assign(bounds_.size() + 1, 0);
}

// A value lands in the first bucket whose bound is >= v ("le"); NaN lands in +Inf and makes
// the sum NaN, as in the reference Prometheus clients.
void Histogram::observe(double v) {
  size_t bucket = bounds_.size();
  if (!std::isnan(v)) {
    bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;  // immutable after construction
  std::lock_guard<std::mutex> lock(mu_);
  s.cumulative_counts.resize(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    s.cumulative_counts[i] = running;
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

}  // namespace helios
