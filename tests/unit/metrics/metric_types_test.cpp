#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "helios/metrics.h"
#include "metrics/text_format.h"

namespace helios {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename F>
void run_threads(int n_threads, F f) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(f, t);
  for (auto& t : threads) t.join();
}

TEST(MetricTypes, CounterCountsUpAndIgnoresDecrements) {
  Counter c;
  EXPECT_EQ(c.value(), 0);
  c.inc();
  c.inc(2.5);
  EXPECT_EQ(c.value(), 3.5);
  c.inc(-1);   // counters never go down
  c.inc(kNaN);
  EXPECT_EQ(c.value(), 3.5);
  c.inc(0);
  EXPECT_EQ(c.value(), 3.5);
}

TEST(MetricTypes, GaugeSetsAndAdds) {
  Gauge g;
  g.set(10);
  g.add(-2.5);
  g.add(0.5);
  EXPECT_EQ(g.value(), 8);
  g.set(-3);
  EXPECT_EQ(g.value(), -3);
}

TEST(MetricTypes, CounterAndGaugeAreExactUnderConcurrentUpdates) {
  Counter c;
  Gauge g;
  constexpr int kThreads = 8, kPerThread = 50000;
  run_threads(kThreads, [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      c.inc();
      g.add(t % 2 == 0 ? 2.0 : -1.0);  // integers stay exact in a double
    }
  });
  EXPECT_EQ(c.value(), kThreads * kPerThread);
  EXPECT_EQ(g.value(), (kThreads / 2) * kPerThread * 2.0 - (kThreads / 2) * kPerThread * 1.0);
}

TEST(MetricTypes, HistogramBucketsAreCumulativeWithInclusiveUpperBounds) {
  Histogram h({0.5, 1, 2});
  for (double v : {0.25, 0.5, 0.75, 1.0, 1.5, 3.0, 100.0}) h.observe(v);
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.upper_bounds, (std::vector<double>{0.5, 1, 2}));
  // le=0.5: {0.25, 0.5}; le=1: +{0.75, 1}; le=2: +{1.5}; +Inf: +{3, 100}
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 4, 5, 7}));
  EXPECT_EQ(s.count, 7u);
  EXPECT_DOUBLE_EQ(s.sum, 0.25 + 0.5 + 0.75 + 1.0 + 1.5 + 3.0 + 100.0);
}

TEST(MetricTypes, HistogramWithoutBoundsHasOnlyTheInfBucket) {
  Histogram h({});
  h.observe(-5);
  h.observe(5);
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2}));
  EXPECT_EQ(s.sum, 0);
}

TEST(MetricTypes, HistogramCleansUpBounds) {
  // Unsorted, duplicated and non-finite bounds: sorted, de-duplicated, non-finite dropped.
  Histogram h({2, kInf, 1, kNaN, 2, -kInf, 0.5});
  EXPECT_EQ(h.snapshot().upper_bounds, (std::vector<double>{0.5, 1, 2}));
  EXPECT_EQ(h.snapshot().cumulative_counts.size(), 4u);
}

TEST(MetricTypes, HistogramNaNGoesToInfBucket) {
  Histogram h({1});
  h.observe(kNaN);
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(MetricTypes, HistogramIsExactUnderConcurrentObservations) {
  Histogram h({1, 10});
  constexpr int kThreads = 8, kPerThread = 20000;
  run_threads(kThreads, [&](int t) {
    for (int i = 0; i < kPerThread; ++i) h.observe(i % 3 == 0 ? 0.5 : (i % 3 == 1 ? 5 : 50));
  });
  Histogram::Snapshot s = h.snapshot();
  uint64_t per_bucket_per_thread[3] = {0, 0, 0};
  for (int i = 0; i < kPerThread; ++i) ++per_bucket_per_thread[i % 3];
  EXPECT_EQ(s.count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s.cumulative_counts[0], kThreads * per_bucket_per_thread[0]);
  EXPECT_EQ(s.cumulative_counts[1], kThreads * (per_bucket_per_thread[0] + per_bucket_per_thread[1]));
  EXPECT_EQ(s.cumulative_counts[2], s.count);
  EXPECT_EQ(s.sum, kThreads * (0.5 * per_bucket_per_thread[0] + 5.0 * per_bucket_per_thread[1] +
                               50.0 * per_bucket_per_thread[2]));
}

TEST(MetricsText, FormatsValuesAsPrometheusParsesThem) {
  using metrics_text::format_value;
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.0), "0");
  EXPECT_EQ(format_value(42), "42");
  EXPECT_EQ(format_value(-7), "-7");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(2.5), "2.5");
  EXPECT_EQ(format_value(1.5e-7), "1.5e-07");
  EXPECT_EQ(format_value(1e300), "1e+300");
  EXPECT_EQ(format_value(kInf), "+Inf");
  EXPECT_EQ(format_value(-kInf), "-Inf");
  EXPECT_EQ(format_value(kNaN), "NaN");
  // Non-integral values read back exactly.
  for (double v : {0.1, 1.0 / 3, 123.456, 6.02214076e23, -2.2250738585072014e-308}) {
    EXPECT_EQ(std::stod(format_value(v)), v) << format_value(v);
  }
}

TEST(MetricsText, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(metrics_text::escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(metrics_text::escape_label_value("plain ünïcode"), "plain ünïcode");
  EXPECT_EQ(metrics_text::escape_help("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(MetricsText, ChecksNames) {
  EXPECT_TRUE(metrics_text::valid_metric_name("helios_requests_total"));
  EXPECT_TRUE(metrics_text::valid_metric_name("job:rate5m"));
  EXPECT_TRUE(metrics_text::valid_metric_name("_x9"));
  EXPECT_FALSE(metrics_text::valid_metric_name(""));
  EXPECT_FALSE(metrics_text::valid_metric_name("9lives"));
  EXPECT_FALSE(metrics_text::valid_metric_name("has-dash"));
  EXPECT_FALSE(metrics_text::valid_metric_name("has space"));
  EXPECT_TRUE(metrics_text::valid_label_name("model"));
  EXPECT_FALSE(metrics_text::valid_label_name("__name__"));
  EXPECT_FALSE(metrics_text::valid_label_name("a:b"));
  EXPECT_FALSE(metrics_text::valid_label_name("1a"));
  EXPECT_FALSE(metrics_text::valid_label_name(""));
}

}  // namespace
}  // namespace helios
