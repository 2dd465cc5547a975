// Sampling on the device against its CPU twin (ref_sample_rows), and through the CUDA backend
// against the host sampler. Tolerances: tokens identical (the device sums in another order, so a
// draw landing within ~1e-12 of a boundary between two tokens could differ; none of these do);
// logprobs 1e-4 absolute (float exponentials summed in double over up to 152K logits). Groups of
// greedy rows skip the sort (all_greedy): both paths are compared with the twin.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "helios/backend.h"
#include "helios/sampler.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::DeviceArray;
using gpu_test::normal_floats;

// Rows of every kind, each over its own row of logits: greedy with a ban, plain temperature,
// top-k, top-p, min-p, all cuts, penalties, and draws at both ends of [0, 1).
struct Rows {
  std::vector<kernels::SampleRow> rows;
  std::vector<kernels::LogitAdjust> adjust;
};

Rows every_kind(int32_t n_vocab) {
  Rows out;
  auto add = [&](float temperature, int32_t top_k, float top_p, float min_p, double uniform,
                 std::vector<kernels::LogitAdjust> adjust = {}, float repetition_penalty = 1.0f) {
    kernels::SampleRow r;
    r.logits_row = static_cast<int32_t>(out.rows.size());
    r.temperature = temperature;
    r.top_k = top_k;
    r.top_p = top_p;
    r.min_p = min_p;
    r.uniform = uniform;
    r.repetition_penalty = repetition_penalty;
    r.adjust_begin = static_cast<int32_t>(out.adjust.size());
    out.adjust.insert(out.adjust.end(), adjust.begin(), adjust.end());
    r.adjust_end = static_cast<int32_t>(out.adjust.size());
    out.rows.push_back(r);
  };
  const int32_t last = n_vocab - 1;
  add(0.0f, 0, 1.0f, 0.0f, 0.0, {{0, -50.0f, 0, 0.0f}});
  add(0.8f, 0, 1.0f, 0.0f, 0.37);
  add(1.0f, 40, 1.0f, 0.0f, 0.91);
  add(0.7f, 0, 0.9f, 0.0f, 0.5);
  add(1.3f, 0, 0.05f, 0.0f, 0.99);
  add(1.0f, 0, 1.0f, 0.05f, 0.2);
  add(0.9f, 100, 0.8f, 0.02f, 0.66);
  add(1.0f, 0, 1.0f, 0.0f, 0.0);
  add(1.0f, 0, 1.0f, 0.0f, 0.999999);
  add(0.6f, 50, 0.95f, 0.01f, 0.45, {{1, 2.0f, 1, 0.5f}, {last / 2, 9.0f, 0, 0.0f}, {last, 0.0f, 1, 1.25f}}, 1.3f);
  add(2.5f, 0, 1.0f, 0.0f, 0.73, {{last, 30.0f, 0, 0.0f}});
  return out;
}

struct Drawn {
  std::vector<int32_t> token;
  std::vector<float> logprob;
};

Drawn draw_on_the_twin(const std::vector<float>& logits, int32_t n_vocab, const Rows& r) {
  const auto n_rows = static_cast<int32_t>(r.rows.size());
  Drawn out{std::vector<int32_t>(n_rows), std::vector<float>(n_rows)};
  kernels::ref_sample_rows(logits.data(), n_vocab, r.rows.data(), n_rows, r.adjust.data(), out.token.data(),
                           out.logprob.data());
  return out;
}

// One launch_sample_rows over the rows, everything uploaded first; empty if the launch fails.
Drawn draw_on_the_device(const std::vector<float>& logits, int32_t n_vocab, const Rows& r, bool all_greedy) {
  const auto n_rows = static_cast<int32_t>(r.rows.size());
  DeviceArray<float> d_logits(logits), d_logprob(n_rows);
  DeviceArray<int32_t> d_token(n_rows);
  DeviceArray<kernels::SampleRow> d_rows(r.rows);
  DeviceArray<kernels::LogitAdjust> d_adjust(r.adjust);
  const size_t bytes = kernels::sample_rows_workspace_bytes(n_rows, n_vocab);
  DeviceArray<uint8_t> ws(bytes);
  const int e = kernels::launch_sample_rows(d_logits.get(), n_vocab, d_rows.get(), n_rows, d_adjust.get(), ws.get(),
                                            bytes, d_token.get(), d_logprob.get(), nullptr, all_greedy);
  EXPECT_EQ(e, 0) << "launch_sample_rows";
  if (e != 0) return {};
  return {d_token.to_host(), d_logprob.to_host()};
}

Rows all_greedy_rows(Rows r) {  // bans, biases and penalties kept
  for (kernels::SampleRow& row : r.rows) row.temperature = 0.0f;
  return r;
}

TEST(GpuParity, SampleRowsMatchTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (int32_t n_vocab : {16, 512, 49152, 151936}) {
    SCOPED_TRACE("n_vocab " + std::to_string(n_vocab));
    const Rows r = every_kind(n_vocab);
    const auto n_rows = static_cast<int32_t>(r.rows.size());
    auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, n_vocab, 3.0f);
    if (n_vocab > 10) {  // row 7: a flat row of ties, the order of equal values decides
      for (int32_t i = 0; i < n_vocab; ++i) logits[7 * static_cast<size_t>(n_vocab) + i] = std::round(logits[i]);
    }
    // Row 0 (greedy): its largest logits are -0 (id 2) and +0 (id 5), equal to the host, so id 2.
    for (int32_t i = 0; i < n_vocab; ++i) logits[i] = -1.0f - std::fabs(logits[i]);
    logits[2] = -0.0f;
    logits[5] = 0.0f;
    Drawn want = draw_on_the_twin(logits, n_vocab, r);
    EXPECT_EQ(want.token[0], 2) << "the twin takes -0 and +0 as equal";
    Drawn got = draw_on_the_device(logits, n_vocab, r, false);
    EXPECT_EQ(got.token, want.token);
    EXPECT_TRUE(gpu_test::all_near(got.logprob, want.logprob, 0.0f, 1e-4f)) << "logprobs";
    // Every row greedy: the sort and the direct argmax (all_greedy) give the twin's tokens, ties
    // and -0 included.
    const Rows greedy = all_greedy_rows(r);
    want = draw_on_the_twin(logits, n_vocab, greedy);
    for (const bool all_greedy : {false, true}) {
      got = draw_on_the_device(logits, n_vocab, greedy, all_greedy);
      EXPECT_EQ(got.token, want.token) << "greedy rows, all_greedy " << all_greedy;
      EXPECT_TRUE(gpu_test::all_near(got.logprob, want.logprob, 0.0f, 1e-4f))
          << "greedy logprobs, all_greedy " << all_greedy;
    }
  }
}

// Logits as softmax_logit takes them, greedy or drawn: the device takes the twin's tokens and
// log-probabilities over rows with NaN at their best logit and at every seventh, rows with two
// +inf, and a row of NaN and -inf alone.
TEST(GpuParity, SampleRowsPassOverNanAsTheTwinDoes) {
  HELIOS_REQUIRE_GPU();
  const int32_t n_vocab = 49152;
  const Rows r = every_kind(n_vocab);
  const auto n_rows = static_cast<int32_t>(r.rows.size());
  auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, 5, 3.0f);
  for (int32_t row = 0; row < n_rows; ++row) {
    float* x = logits.data() + static_cast<size_t>(row) * n_vocab;
    x[kernels::ref_argmax(x, n_vocab)] = NAN;
    for (int32_t i = row; i < n_vocab; i += 7) x[i] = NAN;
    if (row % 3 == 1) x[4 * row + 2] = x[n_vocab - 2] = INFINITY;
  }
  std::fill(logits.begin() + static_cast<size_t>(n_rows - 1) * n_vocab, logits.end(), NAN);  // the last row:
  logits[static_cast<size_t>(n_rows - 1) * n_vocab + 100] = -INFINITY;                        // no number at all
  for (const bool greedy : {false, true}) {
    const Rows rows = greedy ? all_greedy_rows(r) : r;
    const Drawn want = draw_on_the_twin(logits, n_vocab, rows);
    for (int32_t row = 0; row + 1 < n_rows; ++row) {
      const float taken = logits[static_cast<size_t>(row) * n_vocab + want.token[row]];
      EXPECT_FALSE(std::isnan(taken)) << "row " << row;
      if (row % 3 == 1) {
        EXPECT_EQ(taken, INFINITY) << "row " << row << ": the +inf take the mass";
        EXPECT_FLOAT_EQ(want.logprob[row], std::log(0.5f)) << "row " << row << ": two +inf share it";
      }
    }
    if (greedy) {
      EXPECT_EQ(want.token[n_rows - 1], 0) << "no number: the first id";
    }
    EXPECT_FLOAT_EQ(want.logprob[n_rows - 1], -std::log(static_cast<float>(n_vocab))) << "no number: uniform";
    for (const bool all_greedy : greedy ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      Drawn got = draw_on_the_device(logits, n_vocab, rows, all_greedy);
      ASSERT_EQ(got.token.size(), static_cast<size_t>(n_rows));
      EXPECT_EQ(got.token, want.token) << "greedy " << greedy << ", all_greedy " << all_greedy;
      EXPECT_TRUE(gpu_test::all_near(got.logprob, want.logprob, 0.0f, 1e-4f)) << "logprobs";
    }
  }
}

// The device sorts every row at once by one 64-bit key per logit (its row above it). Without a
// GPU: sorted as cub's stable radix sort sorts them (ascending on the first sample_sort_end_bit
// bits, ties in input order), the keys give each row the twin's order, ties, -0 and denormals
// included, and a greedy row's first id is the twin's argmax; NaN sorts as -inf, as the twin takes it.
TEST(SampleSortKeys, SortedKeysGiveEachRowTheTwinsOrder) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int32_t n_vocab = 600;
  const std::vector<float> temperatures = {0.0f, 0.7f, 1.3f, 1.0f};
  const auto n_rows = static_cast<int32_t>(temperatures.size());
  auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, 11, 4.0f);
  const std::vector<float> special = {-0.0f, 0.0f, inf, -inf, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 2.5f, 2.5f, -0.0f};
  for (int32_t r = 0; r < n_rows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * n_vocab;
    for (size_t k = 0; k < special.size(); ++k) row[37 * k + r] = special[k];
    for (int32_t i = 400; i < n_vocab; ++i) row[i] = std::round(row[i]);  // many ties
  }
  const int end_bit = kernels::sample_sort_end_bit(n_rows);
  ASSERT_EQ(end_bit, 34);
  std::vector<uint64_t> keys(logits.size());
  for (size_t at = 0; at < logits.size(); ++at) {
    const auto r = static_cast<int32_t>(at / n_vocab);
    keys[at] = kernels::sample_sort_key(r, logits[at], temperatures[r]);
    ASSERT_EQ(keys[at] >> end_bit, 0u) << "a key holds bits the sort does not read";
    const float tempered = temperatures[r] == 0.0f ? kernels::softmax_logit(logits[at])
                                                   : kernels::tempered_logit(logits[at], temperatures[r]);
    const float back = kernels::sample_sort_key_logit(keys[at]);
    EXPECT_EQ(back, tempered) << "logit " << logits[at] << " at " << at;
    EXPECT_FALSE(std::signbit(back) && back == 0.0f) << "-0 sorts as +0";
  }
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  for (int32_t r = 0; r < n_rows; ++r) {
    const float t = temperatures[r] == 0.0f ? 1.0f : temperatures[r];
    std::vector<std::pair<float, int32_t>> want(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) {
      want[i] = {kernels::tempered_logit(logits[static_cast<size_t>(r) * n_vocab + i], t), i};
    }
    std::stable_sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int32_t i = 0; i < n_vocab; ++i) {
      const size_t at = order[static_cast<size_t>(r) * n_vocab + i];
      ASSERT_EQ(at / n_vocab, static_cast<size_t>(r)) << "rows stay apart";
      ASSERT_EQ(static_cast<int32_t>(at % n_vocab), want[i].second) << "row " << r << " place " << i;
    }
  }
  // A greedy row: its first id is max_element's (the -0 before +0 tie goes to the lower id).
  const float* row0 = logits.data();
  EXPECT_EQ(static_cast<int32_t>(order[0]), static_cast<int32_t>(std::max_element(row0, row0 + n_vocab) - row0));

  // NaN: the key of -inf, at every temperature, so the ids order it among the -inf.
  for (const float t : temperatures) {
    EXPECT_EQ(kernels::sample_sort_key(2, nan, t), kernels::sample_sort_key(2, -inf, t)) << "temperature " << t;
    EXPECT_EQ(kernels::sample_sort_key(2, -nan, t), kernels::sample_sort_key(2, -inf, t)) << "temperature " << t;
  }
  EXPECT_EQ(kernels::sample_sort_key_logit(kernels::sample_sort_key(2, nan, 1.0f)), -inf);
  const std::vector<std::pair<int32_t, int>> end_bits = {{1, 32}, {2, 33}, {3, 34}, {32, 37}, {33, 38}, {65535, 48}};
  for (const auto& [rows, bits] : end_bits) {
    EXPECT_EQ(kernels::sample_sort_end_bit(rows), bits) << rows << " rows";
  }
}

// The backend draws rows where they lie in the logits, in groups, and takes the host sampler's
// tokens over a seeded generation's worth of steps.
TEST(GpuParity, BackendSampleRowsTakeTheHostSamplersTokens) {
  HELIOS_REQUIRE_GPU();
  auto backend = make_backend("cuda", 0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  const int32_t n_vocab = 32000, n_rows = 40;  // more rows than one group
  std::vector<Sampler> host, planned;
  for (int32_t i = 0; i < n_rows; ++i) {
    SamplingParams p;
    p.temperature = 0.5f + 0.05f * i;
    p.top_k = i % 3 == 0 ? 30 : 0;
    p.top_p = i % 4 == 1 ? 0.9f : 1.0f;
    p.min_p = i % 5 == 2 ? 0.05f : 0.0f;
    p.repetition_penalty = i % 2 ? 1.2f : 1.0f;
    p.presence_penalty = i % 7 == 3 ? 0.5f : 0.0f;
    p.seed = 1000 + i;
    host.emplace_back(p);
    planned.emplace_back(p);
  }
  std::vector<std::vector<TokenId>> history(n_rows, std::vector<TokenId>{5, 6, 7});
  float* d_logits = (*backend)->alloc(static_cast<size_t>(n_rows) * n_vocab);
  for (int step = 0; step < 8; ++step) {
    auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, 77 + step, 3.0f);
    (*backend)->upload(d_logits, logits.data(), logits.size());
    std::vector<kernels::SampleRow> rows;
    std::vector<kernels::LogitAdjust> adjust;
    for (int32_t i = 0; i < n_rows; ++i) {
      auto draw = planned[i].plan_draw(history[i], n_vocab);
      ASSERT_TRUE(draw.has_value());
      draw->row.logits_row = n_rows - 1 - i;  // rows read out of order
      draw->row.adjust_begin = static_cast<int32_t>(adjust.size());
      adjust.insert(adjust.end(), draw->adjust.begin(), draw->adjust.end());
      draw->row.adjust_end = static_cast<int32_t>(adjust.size());
      rows.push_back(draw->row);
    }
    std::vector<int32_t> got(n_rows);
    std::vector<float> logprob(n_rows);
    (*backend)->sample_rows(d_logits, n_vocab, rows.data(), n_rows, adjust.data(), static_cast<int32_t>(adjust.size()),
                            got.data(), logprob.data());
    ASSERT_TRUE((*backend)->error().ok()) << (*backend)->error().to_string();
    // The same draws beside every row's statistics, in one wait: the same tokens, and the
    // statistics exit_stats gives alone.
    std::vector<int32_t> both_token(n_rows), top1(n_rows), top1_alone(n_rows);
    std::vector<float> both_logprob(n_rows), stats(4 * n_rows), stats_alone(4 * n_rows);
    (*backend)->exit_stats_and_sample(d_logits, n_rows, n_vocab, top1.data(), stats.data(), stats.data() + n_rows,
                                      stats.data() + 2 * n_rows, rows.data(), n_rows, adjust.data(),
                                      static_cast<int32_t>(adjust.size()), both_token.data(), both_logprob.data());
    (*backend)->exit_stats(d_logits, n_rows, n_vocab, top1_alone.data(), stats_alone.data(), stats_alone.data() + n_rows,
                           stats_alone.data() + 2 * n_rows);
    EXPECT_EQ(both_token, got) << "step " << step;
    EXPECT_EQ(both_logprob, logprob) << "step " << step;
    EXPECT_EQ(top1, top1_alone) << "step " << step;
    EXPECT_EQ(stats, stats_alone) << "step " << step;
    for (int32_t i = 0; i < n_rows; ++i) {
      std::vector<float> row(logits.begin() + static_cast<size_t>(n_rows - 1 - i) * n_vocab,
                             logits.begin() + static_cast<size_t>(n_rows - i) * n_vocab);
      const kernels::LogSoftmax log_softmax = kernels::cpu_log_softmax(row.data(), n_vocab);
      const TokenId want = host[i].sample(row.data(), n_vocab, history[i]);
      ASSERT_EQ(got[i], want) << "row " << i << " step " << step;
      EXPECT_NEAR(logprob[i], log_softmax.at(logits[static_cast<size_t>(n_rows - 1 - i) * n_vocab + want]), 1e-4f);
      host[i].accept(want);
      planned[i].accept(want);
      history[i].push_back(want);
    }
  }
  (*backend)->free(d_logits);
}

}  // namespace
}  // namespace helios
