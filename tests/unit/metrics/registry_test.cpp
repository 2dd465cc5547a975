#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "helios/metrics.h"

namespace helios {
namespace {

TEST(MetricsRegistry, RendersTextFormatExactly) {
  MetricsRegistry r;
  r.counter("helios_requests_total", "Requests received.", {{"model", "tiny"}})->inc(3);
  r.counter("helios_requests_total", "Requests received.", {{"model", "big"}})->inc();
  r.gauge("helios_requests_running", "Requests in the running batch.")->set(2);
  Histogram* h = r.histogram("helios_time_to_first_token_seconds", "Time to first token.", {0.125, 0.5, 1});
  for (double v : {0.0625, 0.25, 0.25, 7.0}) h->observe(v);
  EXPECT_EQ(r.render(),
            "# HELP helios_requests_running Requests in the running batch.\n"
            "# TYPE helios_requests_running gauge\n"
            "helios_requests_running 2\n"
            "# HELP helios_requests_total Requests received.\n"
            "# TYPE helios_requests_total counter\n"
            "helios_requests_total{model=\"big\"} 1\n"
            "helios_requests_total{model=\"tiny\"} 3\n"
            "# HELP helios_time_to_first_token_seconds Time to first token.\n"
            "# TYPE helios_time_to_first_token_seconds histogram\n"
            "helios_time_to_first_token_seconds_bucket{le=\"0.125\"} 1\n"
            "helios_time_to_first_token_seconds_bucket{le=\"0.5\"} 3\n"
            "helios_time_to_first_token_seconds_bucket{le=\"1\"} 3\n"
            "helios_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n"
            "helios_time_to_first_token_seconds_sum 7.5625\n"
            "helios_time_to_first_token_seconds_count 4\n");
}

TEST(MetricsRegistry, EmptyRegistryRendersNothing) {
  MetricsRegistry r;
  EXPECT_EQ(r.render(), "");
}

TEST(MetricsRegistry, SortsAndEscapesLabels) {
  MetricsRegistry r;
  r.gauge("g", "Help with \\ backslash and\nnewline and \"quotes\".",
          {{"zeta", "z"}, {"alpha", "back\\slash \"quoted\"\nnext line"}})
      ->set(0.5);
  EXPECT_EQ(r.render(),
            "# HELP g Help with \\\\ backslash and\\nnewline and \"quotes\".\n"
            "# TYPE g gauge\n"
            "g{alpha=\"back\\\\slash \\\"quoted\\\"\\nnext line\",zeta=\"z\"} 0.5\n");
}

TEST(MetricsRegistry, HistogramLabelsComeBeforeLe) {
  MetricsRegistry r;
  Histogram* h = r.histogram("lat_seconds", "Latency.", {2.5}, {{"phase", "decode"}});
  h->observe(1);
  EXPECT_EQ(r.render(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{phase=\"decode\",le=\"2.5\"} 1\n"
            "lat_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 1\n"
            "lat_seconds_sum{phase=\"decode\"} 1\n"
            "lat_seconds_count{phase=\"decode\"} 1\n");
}

TEST(MetricsRegistry, RendersSpecialValues) {
  MetricsRegistry r;
  r.gauge("a", "A.")->set(std::numeric_limits<double>::infinity());
  r.gauge("b", "B.")->set(-std::numeric_limits<double>::infinity());
  r.gauge("c", "C.")->set(std::numeric_limits<double>::quiet_NaN());
  r.gauge("d", "D.")->set(1e21);
  r.gauge("e", "")->set(0.001);
  EXPECT_EQ(r.render(),
            "# HELP a A.\n# TYPE a gauge\na +Inf\n"
            "# HELP b B.\n# TYPE b gauge\nb -Inf\n"
            "# HELP c C.\n# TYPE c gauge\nc NaN\n"
            "# HELP d D.\n# TYPE d gauge\nd 1e+21\n"
            "# HELP e \n# TYPE e gauge\ne 0.001\n");
}

TEST(MetricsRegistry, SameNameAndLabelsReturnTheSameObject) {
  MetricsRegistry r;
  Counter* a = r.counter("c_total", "C.", {{"k", "v"}});
  EXPECT_EQ(a, r.counter("c_total", "C.", {{"k", "v"}}));
  EXPECT_EQ(a, r.counter("c_total", "Other help is ignored.", {{"k", "v"}}));
  EXPECT_NE(a, r.counter("c_total", "C.", {{"k", "w"}}));
  EXPECT_NE(a, r.counter("c_total", "C."));
  Gauge* g = r.gauge("g", "G.");
  EXPECT_EQ(g, r.gauge("g", "G."));
  Histogram* h = r.histogram("h", "H.", {1, 2});
  EXPECT_EQ(h, r.histogram("h", "H.", {1, 2}));
  EXPECT_EQ(h, r.histogram("h", "H.", {5}));  // the first bounds stay
  EXPECT_EQ(h->snapshot().upper_bounds, (std::vector<double>{1, 2}));
  // The help given first is the one rendered.
  EXPECT_NE(r.render().find("# HELP c_total C.\n"), std::string::npos);
}

TEST(MetricsRegistry, SameNameWithAnotherTypeIsNull) {
  MetricsRegistry r;
  ASSERT_NE(r.counter("x", "X."), nullptr);
  EXPECT_EQ(r.gauge("x", "X."), nullptr);
  EXPECT_EQ(r.histogram("x", "X.", {1}), nullptr);
  EXPECT_EQ(r.gauge("x", "X.", {{"other", "labels"}}), nullptr);
  ASSERT_NE(r.histogram("h", "H.", {1}), nullptr);
  EXPECT_EQ(r.counter("h", "H."), nullptr);
  EXPECT_EQ(r.render(), "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\n"
                        "h_sum 0\nh_count 0\n# HELP x X.\n# TYPE x counter\nx 0\n");
}

TEST(MetricsRegistry, NamesThatWouldCollideWithHistogramSeriesAreNull) {
  MetricsRegistry r;
  ASSERT_NE(r.histogram("lat", "L.", {1}), nullptr);
  EXPECT_EQ(r.counter("lat_count", "C."), nullptr);
  EXPECT_EQ(r.gauge("lat_sum", "S."), nullptr);
  EXPECT_EQ(r.gauge("lat_bucket", "B."), nullptr);
  ASSERT_NE(r.counter("req_count", "C."), nullptr);
  EXPECT_EQ(r.histogram("req", "R.", {1}), nullptr);
}

TEST(MetricsRegistry, InvalidNamesLabelsAndBoundsAreNull) {
  MetricsRegistry r;
  EXPECT_EQ(r.counter("", "E."), nullptr);
  EXPECT_EQ(r.counter("bad-name", "E."), nullptr);
  EXPECT_EQ(r.gauge("g", "G.", {{"bad-label", "v"}}), nullptr);
  EXPECT_EQ(r.gauge("g", "G.", {{"__reserved", "v"}}), nullptr);
  EXPECT_EQ(r.histogram("h", "H.", {1}, {{"le", "1"}}), nullptr);
  EXPECT_EQ(r.histogram("h", "H.", {2, 1}), nullptr);
  EXPECT_EQ(r.histogram("h", "H.", {1, 1}), nullptr);
  EXPECT_EQ(r.histogram("h", "H.", {1, std::numeric_limits<double>::infinity()}), nullptr);
  EXPECT_EQ(r.histogram("h", "H.", {std::numeric_limits<double>::quiet_NaN()}), nullptr);
  EXPECT_EQ(r.render(), "");  // failed registrations leave no empty families behind
  EXPECT_NE(r.gauge("g", "G.", {{"le", "fine on a gauge"}}), nullptr);
}

TEST(MetricsRegistry, ConcurrentRegistrationAndRendering) {
  MetricsRegistry r;
  constexpr int kThreads = 8, kPerThread = 2000;
  std::vector<std::set<Counter*>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Counter* c = r.counter("ops_total", "Ops.", {{"shard", std::to_string(i % 4)}});
        c->inc();
        seen[t].insert(c);
        if (i % 100 == 0) (void)r.render();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(seen[t], seen[0]);
  EXPECT_EQ(seen[0].size(), 4u);
  std::string expected = "# HELP ops_total Ops.\n# TYPE ops_total counter\n";
  for (int s = 0; s < 4; ++s) {
    expected += "ops_total{shard=\"" + std::to_string(s) + "\"} " + std::to_string(kThreads * kPerThread / 4) + "\n";
  }
  EXPECT_EQ(r.render(), expected);
}

}  // namespace
}  // namespace helios
