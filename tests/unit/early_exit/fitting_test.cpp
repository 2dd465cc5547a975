// Calibration fits on synthetic data with a known answer: the ridge adapter recovers an affine
// map, and the logistic probe separates and recovers a known direction.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "helios/early_exit.h"

namespace helios {
namespace {

std::vector<float> normal_floats(size_t n, std::mt19937_64& rng, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// y = W x + b (+ noise); x [n, d] with a non-zero mean so that the bias is not trivially 0.
struct AffineData {
  int32_t d;
  int64_t n;
  std::vector<float> w, b, x, y;
};

AffineData make_affine_data(int32_t d, int64_t n, float noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  AffineData data{d, n, normal_floats(static_cast<size_t>(d) * d, rng, 0.5f), normal_floats(d, rng), {}, {}};
  data.x = normal_floats(static_cast<size_t>(n) * d, rng);
  for (size_t i = 0; i < data.x.size(); ++i) data.x[i] += 2.0f;
  data.y.resize(data.x.size());
  std::normal_distribution<float> noise_dist(0.0f, noise > 0 ? noise : 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int32_t o = 0; o < d; ++o) {
      double v = data.b[o];
      for (int32_t in = 0; in < d; ++in) v += static_cast<double>(data.w[o * d + in]) * data.x[i * d + in];
      data.y[i * d + o] = static_cast<float>(v) + (noise > 0 ? noise_dist(rng) : 0.0f);
    }
  }
  return data;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// Mean squared error of y ≈ W x + b over the data.
double affine_mse(const AffineData& data, const std::vector<float>& w, const std::vector<float>& b) {
  const int32_t d = data.d;
  double sum = 0;
  for (int64_t i = 0; i < data.n; ++i) {
    for (int32_t o = 0; o < d; ++o) {
      double v = b[o];
      for (int32_t in = 0; in < d; ++in) v += static_cast<double>(w[o * d + in]) * data.x[i * d + in];
      sum += (v - data.y[i * d + o]) * (v - data.y[i * d + o]);
    }
  }
  return sum / static_cast<double>(data.n * d);
}

TEST(FitAffineAdapter, RecoversANoiselessMap) {
  const AffineData data = make_affine_data(16, 500, 0.0f, 11);
  std::vector<float> w, b;
  Status s = fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 0.0f, &w, &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_LT(max_abs_diff(w, data.w), 1e-4);
  EXPECT_LT(max_abs_diff(b, data.b), 1e-4);
}

TEST(FitAffineAdapter, RecoversANoiselessMapAcrossCholeskyBlocks) {
  // d larger than the Cholesky block, and n not a multiple of the chunk, exercise the BLAS paths.
  const AffineData data = make_affine_data(200, 1100, 0.0f, 12);
  std::vector<float> w, b;
  Status s = fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 0.0f, &w, &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_LT(max_abs_diff(w, data.w), 1e-3);
  EXPECT_LT(max_abs_diff(b, data.b), 1e-3);
}

TEST(FitAffineAdapter, ReducesErrorOnNoisyData) {
  const float noise = 0.3f;
  const AffineData data = make_affine_data(16, 500, noise, 13);
  std::vector<float> w, b;
  Status s = fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 1e-3f, &w, &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  // The identity (the logit lens) versus the fit: the fit gets near the noise floor.
  std::vector<float> identity(16 * 16, 0.0f), zero(16, 0.0f);
  for (int i = 0; i < 16; ++i) identity[i * 16 + i] = 1.0f;
  const double identity_mse = affine_mse(data, identity, zero);
  const double fitted_mse = affine_mse(data, w, b);
  EXPECT_LT(fitted_mse, identity_mse / 10);
  EXPECT_LT(fitted_mse, 1.1 * noise * noise);
  EXPECT_LT(max_abs_diff(w, data.w), 0.1);
}

TEST(FitAffineAdapter, RidgeShrinksTheWeights) {
  const AffineData data = make_affine_data(8, 200, 0.1f, 14);
  std::vector<float> w_small, b_small, w_large, b_large;
  ASSERT_TRUE(fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 1e-4f, &w_small, &b_small).ok());
  ASSERT_TRUE(fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 10.0f, &w_large, &b_large).ok());
  double norm_small = 0, norm_large = 0;
  for (float v : w_small) norm_small += v * v;
  for (float v : w_large) norm_large += v * v;
  EXPECT_LT(norm_large, norm_small / 4);
}

TEST(FitAffineAdapter, OnePassServesEveryPenalty) {
  const AffineData data = make_affine_data(8, 200, 0.1f, 15);
  std::vector<AffineAdapter> fits;
  ASSERT_TRUE(fit_affine_adapters(data.x.data(), data.y.data(), data.n, data.d, {1e-4f, 0.5f}, &fits).ok());
  ASSERT_EQ(fits.size(), 2u);
  for (const AffineAdapter& fit : fits) {
    std::vector<float> w, b;
    ASSERT_TRUE(fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, fit.ridge, &w, &b).ok());
    EXPECT_EQ(fit.w, w) << fit.ridge;
    EXPECT_EQ(fit.b, b) << fit.ridge;
  }
  EXPECT_GT(max_abs_diff(fits[0].w, fits[1].w), 1e-3);
  std::vector<AffineAdapter> none;
  EXPECT_EQ(fit_affine_adapters(data.x.data(), data.y.data(), data.n, data.d, {}, &none).code(),
            StatusCode::kInvalidArgument);
}

TEST(FitAffineAdapter, ThePenaltyFollowsTheScaleOfTheInputs) {
  // Inputs 100x larger: the same ridge gives the same map (W / 100), as the penalty is in units
  // of the inputs' variance, so one ridge suits layers whose states differ in scale.
  const AffineData data = make_affine_data(8, 200, 0.1f, 16);
  std::vector<float> x_big = data.x;
  for (float& v : x_big) v *= 100.0f;
  std::vector<float> w, b, w_big, b_big;
  ASSERT_TRUE(fit_affine_adapter(data.x.data(), data.y.data(), data.n, data.d, 0.3f, &w, &b).ok());
  ASSERT_TRUE(fit_affine_adapter(x_big.data(), data.y.data(), data.n, data.d, 0.3f, &w_big, &b_big).ok());
  for (float& v : w_big) v *= 100.0f;
  EXPECT_LT(max_abs_diff(w, w_big), 1e-4);
  EXPECT_LT(max_abs_diff(b, b_big), 1e-4);
}

TEST(FitAffineAdapter, RejectsBadInput) {
  std::vector<float> x(8 * 4, 1.0f), y(8 * 4, 1.0f), w, b;
  EXPECT_EQ(fit_affine_adapter(x.data(), y.data(), 1, 4, 0.1f, &w, &b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fit_affine_adapter(x.data(), y.data(), 8, 0, 0.1f, &w, &b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fit_affine_adapter(x.data(), y.data(), 8, 4, -1.0f, &w, &b).code(), StatusCode::kInvalidArgument);
  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fit_affine_adapter(x.data(), y.data(), 8, 4, 0.1f, &w, &b).code(), StatusCode::kInvalidArgument);
}

TEST(FitAffineAdapter, CollinearInputsWithoutRidgeSuggestARidge) {
  // Every x is the same vector: Xc = 0, so X^T X is singular without a ridge.
  std::vector<float> x(8 * 4, 1.0f), y(8 * 4, 2.0f), w, b;
  Status s = fit_affine_adapter(x.data(), y.data(), 8, 4, 0.0f, &w, &b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ridge"), std::string::npos) << s.message();
  // Of several penalties, the ones that are well posed are fitted.
  std::vector<AffineAdapter> fits;
  ASSERT_TRUE(fit_affine_adapters(x.data(), y.data(), 8, 4, {0.0f, 0.1f}, &fits).ok());
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(fits[0].ridge, 0.1f);
  // With a ridge it is well posed: W = 0 and b = ȳ.
  ASSERT_TRUE(fit_affine_adapter(x.data(), y.data(), 8, 4, 0.1f, &w, &b).ok());
  for (float v : w) EXPECT_EQ(v, 0.0f);
  for (float v : b) EXPECT_FLOAT_EQ(v, 2.0f);
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double accuracy(const std::vector<float>& x, const std::vector<uint8_t>& labels, int32_t d,
                const std::vector<float>& w, float b) {
  int64_t correct = 0;
  const auto n = static_cast<int64_t>(labels.size());
  for (int64_t i = 0; i < n; ++i) {
    double z = b;
    for (int32_t j = 0; j < d; ++j) z += static_cast<double>(w[j]) * x[i * d + j];
    correct += (z > 0) == (labels[i] != 0);
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

TEST(FitLogisticProbe, SeparatesLinearlySeparableData) {
  const int32_t d = 12;
  const int64_t n = 2000;
  std::mt19937_64 rng(21);
  const std::vector<float> direction = normal_floats(d, rng);
  const std::vector<float> x = normal_floats(static_cast<size_t>(n) * d, rng);
  std::vector<uint8_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    double z = 0.5;
    for (int32_t j = 0; j < d; ++j) z += direction[j] * x[i * d + j];
    labels[i] = z > 0;
  }
  std::vector<float> w;
  float b = 0;
  Status s = fit_logistic_probe(x.data(), labels.data(), n, d, 1e-3f, 50, &w, &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_GT(accuracy(x, labels, d, w, b), 0.95);
}

TEST(FitLogisticProbe, MatchesAKnownModelOnSampledLabels) {
  const int32_t d = 8;
  const int64_t n = 20000;
  std::mt19937_64 rng(22);
  std::vector<float> true_w = normal_floats(d, rng);
  const float true_b = -0.4f;
  const std::vector<float> x = normal_floats(static_cast<size_t>(n) * d, rng);
  std::vector<uint8_t> labels(n);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < n; ++i) {
    double z = true_b;
    for (int32_t j = 0; j < d; ++j) z += true_w[j] * x[i * d + j];
    labels[i] = uniform(rng) < sigmoid(z);
  }
  std::vector<float> w;
  float b = 0;
  Status s = fit_logistic_probe(x.data(), labels.data(), n, d, 1e-5f, 50, &w, &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  double dot = 0, norm_w = 0, norm_true = 0;
  for (int32_t j = 0; j < d; ++j) {
    dot += static_cast<double>(w[j]) * true_w[j];
    norm_w += static_cast<double>(w[j]) * w[j];
    norm_true += static_cast<double>(true_w[j]) * true_w[j];
  }
  EXPECT_GT(dot / std::sqrt(norm_w * norm_true), 0.99);
  EXPECT_NEAR(std::sqrt(norm_w / norm_true), 1.0, 0.1);  // the scale too, not only the direction
  EXPECT_NEAR(b, true_b, 0.1);
}

TEST(FitLogisticProbe, OneClassGivesZeroWeightsAndTheBaseRate) {
  const int32_t d = 4;
  std::mt19937_64 rng(23);
  const std::vector<float> x = normal_floats(100 * d, rng);
  std::vector<float> w;
  float b = 0;
  const std::vector<uint8_t> ones(100, 1), zeros(100, 0);
  ASSERT_TRUE(fit_logistic_probe(x.data(), ones.data(), 100, d, 1e-3f, 20, &w, &b).ok());
  EXPECT_EQ(w, std::vector<float>(d, 0.0f));
  EXPECT_GT(b, 5.0f);
  EXPECT_TRUE(std::isfinite(b));
  ASSERT_TRUE(fit_logistic_probe(x.data(), zeros.data(), 100, d, 1e-3f, 20, &w, &b).ok());
  EXPECT_EQ(w, std::vector<float>(d, 0.0f));
  EXPECT_LT(b, -5.0f);
}

TEST(FitLogisticProbe, StrongerL2ShrinksTheWeights) {
  const int32_t d = 6;
  const int64_t n = 1000;
  std::mt19937_64 rng(24);
  const std::vector<float> x = normal_floats(static_cast<size_t>(n) * d, rng);
  std::vector<uint8_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = x[i * d] + 0.3f * x[i * d + 1] > 0;
  std::vector<float> w_weak, w_strong;
  float b = 0;
  ASSERT_TRUE(fit_logistic_probe(x.data(), labels.data(), n, d, 1e-2f, 50, &w_weak, &b).ok());
  ASSERT_TRUE(fit_logistic_probe(x.data(), labels.data(), n, d, 1.0f, 50, &w_strong, &b).ok());
  EXPECT_LT(std::abs(w_strong[0]), std::abs(w_weak[0]) / 2);
  EXPECT_GT(w_strong[0], 0.0f);
}

TEST(FitLogisticProbe, RejectsBadInput) {
  std::vector<float> x(10 * 2, 0.5f), w;
  std::vector<uint8_t> labels(10, 0);
  labels[0] = 1;
  float b = 0;
  EXPECT_FALSE(fit_logistic_probe(x.data(), labels.data(), 0, 2, 1e-3f, 10, &w, &b).ok());
  EXPECT_FALSE(fit_logistic_probe(x.data(), labels.data(), 10, 0, 1e-3f, 10, &w, &b).ok());
  EXPECT_FALSE(fit_logistic_probe(x.data(), labels.data(), 10, 2, -1.0f, 10, &w, &b).ok());
  EXPECT_FALSE(fit_logistic_probe(x.data(), labels.data(), 10, 2, 1e-3f, 0, &w, &b).ok());
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(fit_logistic_probe(x.data(), labels.data(), 10, 2, 1e-3f, 10, &w, &b).ok());
}

}  // namespace
}  // namespace helios
