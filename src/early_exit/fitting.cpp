// Calibration fits for exit heads: a ridge affine adapter h_k → h_L and a logistic probe that
// predicts from h_k whether the exit agrees with the final layer.
//
// Both reduce to a symmetric positive-definite solve. The Gram matrices are accumulated chunk
// by chunk in double with BLAS-3 (so n tokens never need an [n, d] double copy), and factored
// by a blocked Cholesky: d is the model width, up to a few thousand.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "helios/early_exit.h"

namespace helios {
namespace {

constexpr int64_t kChunkRows = 512;     // rows centred/scaled per BLAS call
constexpr int32_t kCholeskyBlock = 96;  // diagonal block factored without BLAS
// Pivots below this fraction of the largest diagonal entry mean the matrix is singular to
// working precision: the solution would be noise.
constexpr double kMinRelativePivot = 1e-10;

Status check_finite(const float* values, int64_t count, const char* what) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) {
      return invalid_argument(std::string(what) + " hold a non-finite value at element " + std::to_string(i));
    }
  }
  return ok_status();
}

// a [d, d] row-major, lower triangle read; on success it holds L with a = L L^T (lower).
// Left-looking blocked: each block column is updated by the columns already factored, then its
// diagonal block is factored directly and the panel below solved against it.
bool cholesky_in_place(std::vector<double>& a, int32_t d) {
  double max_diag = 0;
  for (int32_t i = 0; i < d; ++i) max_diag = std::max(max_diag, a[static_cast<size_t>(i) * d + i]);
  if (!(max_diag > 0) || !std::isfinite(max_diag)) return false;
  const double min_pivot = max_diag * kMinRelativePivot;

  for (int32_t k = 0; k < d; k += kCholeskyBlock) {
    const int32_t kb = std::min(kCholeskyBlock, d - k);
    double* factored_rows = &a[static_cast<size_t>(k) * d];  // rows k.., columns 0..k-1: L so far
    double* diag = &a[static_cast<size_t>(k) * d + k];       // [kb, kb]
    if (k > 0) {
      cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, kb, k, -1.0, factored_rows, d, 1.0, diag, d);
    }
    auto at = [&](int32_t row, int32_t col) -> double& { return diag[static_cast<size_t>(row) * d + col]; };
    for (int32_t j = 0; j < kb; ++j) {
      double pivot = at(j, j);
      for (int32_t p = 0; p < j; ++p) pivot -= at(j, p) * at(j, p);
      if (!(pivot > min_pivot)) return false;
      const double l_jj = std::sqrt(pivot);
      at(j, j) = l_jj;
      for (int32_t i = j + 1; i < kb; ++i) {
        double v = at(i, j);
        for (int32_t p = 0; p < j; ++p) v -= at(i, p) * at(j, p);
        at(i, j) = v / l_jj;
      }
    }
    const int32_t n_below = d - k - kb;
    if (n_below == 0) continue;
    double* panel = &a[static_cast<size_t>(k + kb) * d + k];  // [n_below, kb]
    if (k > 0) {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_below, kb, k, -1.0,
                  &a[static_cast<size_t>(k + kb) * d], d, factored_rows, d, 1.0, panel, d);
    }
    cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, n_below, kb, 1.0, diag, d,
                panel, d);
  }
  return true;
}

// Solves (L L^T) X = B in place; l from cholesky_in_place, b [d, n_rhs] row-major.
void cholesky_solve(const std::vector<double>& l, int32_t d, double* b, int32_t n_rhs) {
  cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, d, n_rhs, 1.0, l.data(), d, b,
              n_rhs);
  cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasTrans, CblasNonUnit, d, n_rhs, 1.0, l.data(), d, b,
              n_rhs);
}

std::vector<double> column_means(const float* rows, int64_t n, int32_t d) {
  std::vector<double> mean(d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = rows + i * d;
    for (int32_t j = 0; j < d; ++j) mean[j] += row[j];
  }
  for (double& m : mean) m /= static_cast<double>(n);
  return mean;
}

double softplus(double z) { return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))); }
double sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

// --- Logistic regression. theta = [w (d), b]; the objective is the mean log-loss plus
// l2/2 |w|^2, so l2 means the same at any number of tokens.
struct LogisticProblem {
  const float* x;         // [n, d]
  const uint8_t* labels;  // [n]
  int64_t n;
  int32_t d;
  double l2;

  double logit(const std::vector<double>& theta, int64_t i) const {
    const float* row = x + i * d;
    double z = theta[d];
    for (int32_t j = 0; j < d; ++j) z += theta[j] * row[j];
    return z;
  }
  double objective(const std::vector<double>& theta) const {
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double z = logit(theta, i);
      loss += softplus(z) - (labels[i] ? z : 0.0);
    }
    double norm_sq = 0;
    for (int32_t j = 0; j < d; ++j) norm_sq += theta[j] * theta[j];
    return loss / static_cast<double>(n) + 0.5 * l2 * norm_sq;
  }
  // Gradient [d + 1] and the lower triangle of the Hessian [d + 1, d + 1] at theta.
  void gradient_and_hessian(const std::vector<double>& theta, std::vector<double>* gradient,
                            std::vector<double>* hessian) const {
    const int32_t k = d + 1;
    gradient->assign(k, 0.0);
    hessian->assign(static_cast<size_t>(k) * k, 0.0);
    std::vector<double> scaled(static_cast<size_t>(kChunkRows) * k);  // rows of sqrt(s_i / n) [x_i, 1]
    const double inv_n = 1.0 / static_cast<double>(n);
    for (int64_t start = 0; start < n; start += kChunkRows) {
      const int64_t n_rows = std::min(kChunkRows, n - start);
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t i = start + r;
        const float* row = x + i * d;
        const double p = sigmoid(logit(theta, i));
        const double residual = (p - (labels[i] ? 1.0 : 0.0)) * inv_n;
        const double weight = std::sqrt(p * (1.0 - p) * inv_n);
        double* out = &scaled[static_cast<size_t>(r) * k];
        for (int32_t j = 0; j < d; ++j) {
          (*gradient)[j] += residual * row[j];
          out[j] = weight * row[j];
        }
        (*gradient)[d] += residual;
        out[d] = weight;
      }
      cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, k, static_cast<int>(n_rows), 1.0, scaled.data(), k, 1.0,
                  hessian->data(), k);
    }
    for (int32_t j = 0; j < d; ++j) {
      (*gradient)[j] += l2 * theta[j];
      (*hessian)[static_cast<size_t>(j) * k + j] += l2;
    }
  }
};

}  // namespace

Status fit_affine_maps(const float* x, int32_t d_in, const float* y, int32_t d_out, int64_t n,
                       const std::vector<float>& ridges, std::vector<AffineAdapter>* out) {
  if (n < 2) return invalid_argument("fit_affine_adapter: needs at least 2 samples (got " + std::to_string(n) + ")");
  if (d_in <= 0 || d_out <= 0) {
    return invalid_argument("fit_affine_adapter: dimensions must be > 0 (got " + std::to_string(d_in) + " in, " +
                            std::to_string(d_out) + " out)");
  }
  if (ridges.empty()) return invalid_argument("fit_affine_adapter: no ridge penalty given");
  for (float ridge : ridges) {
    if (!(ridge >= 0) || !std::isfinite(ridge)) {
      return invalid_argument("fit_affine_adapter: ridge must be finite and >= 0 (got " + std::to_string(ridge) + ")");
    }
  }
  HELIOS_RETURN_IF_ERROR(check_finite(x, n * d_in, "fit_affine_adapter: inputs x"));
  HELIOS_RETURN_IF_ERROR(check_finite(y, n * d_out, "fit_affine_adapter: targets y"));

  // Centring removes the bias from the solve: W from the centred data, then b = ȳ - W x̄. The
  // sums are formed once and solved for every penalty.
  const std::vector<double> mean_x = column_means(x, n, d_in);
  const std::vector<double> mean_y = column_means(y, n, d_out);
  const size_t ii = static_cast<size_t>(d_in) * d_in, io = static_cast<size_t>(d_in) * d_out;
  std::vector<double> gram(ii, 0.0);   // Xc^T Xc [d_in, d_in], lower triangle
  std::vector<double> cross(io, 0.0);  // Xc^T Yc [d_in, d_out]
  std::vector<double> xc(static_cast<size_t>(kChunkRows) * d_in);
  std::vector<double> yc(static_cast<size_t>(kChunkRows) * d_out);
  for (int64_t start = 0; start < n; start += kChunkRows) {
    const int64_t n_rows = std::min(kChunkRows, n - start);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* x_row = x + (start + r) * d_in;
      const float* y_row = y + (start + r) * d_out;
      for (int32_t j = 0; j < d_in; ++j) xc[static_cast<size_t>(r) * d_in + j] = x_row[j] - mean_x[j];
      for (int32_t j = 0; j < d_out; ++j) yc[static_cast<size_t>(r) * d_out + j] = y_row[j] - mean_y[j];
    }
    const int rows = static_cast<int>(n_rows);
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, d_in, rows, 1.0, xc.data(), d_in, 1.0, gram.data(), d_in);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d_in, d_out, rows, 1.0, xc.data(), d_in, yc.data(), d_out,
                1.0, cross.data(), d_out);
  }
  // The penalty in units of the inputs' mean variance times n (trace(Xc^T Xc) / d_in), so that one
  // ridge means the same at any number of tokens and at any scale of the hidden states.
  double trace = 0;
  for (int32_t j = 0; j < d_in; ++j) trace += gram[static_cast<size_t>(j) * d_in + j];
  const double unit = trace > 0 ? trace / d_in : static_cast<double>(n);
  // A penalty too small for (nearly) collinear inputs is skipped; an error only when none is left.
  out->clear();
  float failed = -1;
  for (float ridge : ridges) {
    std::vector<double> factor = gram, solved = cross;
    for (int32_t j = 0; j < d_in; ++j) factor[static_cast<size_t>(j) * d_in + j] += static_cast<double>(ridge) * unit;
    if (!cholesky_in_place(factor, d_in)) {
      failed = std::max(failed, ridge);
      continue;
    }
    cholesky_solve(factor, d_in, solved.data(), d_out);  // solved holds W^T [in, out]
    AffineAdapter a;
    a.ridge = ridge;
    a.w.assign(io, 0.0f);
    a.b.assign(d_out, 0.0f);
    for (int32_t o = 0; o < d_out; ++o) {
      double bias = mean_y[o];
      for (int32_t in = 0; in < d_in; ++in) {
        const double weight = solved[static_cast<size_t>(in) * d_out + o];
        a.w[static_cast<size_t>(o) * d_in + in] = static_cast<float>(weight);
        bias -= weight * mean_x[in];
      }
      a.b[o] = static_cast<float>(bias);
    }
    out->push_back(std::move(a));
  }
  if (out->empty()) {
    return invalid_argument("fit_affine_adapter: X^T X + ridge*I is not positive definite (n " + std::to_string(n) +
                            ", d " + std::to_string(d_in) + ", ridge " + std::to_string(failed) +
                            "): the inputs are (nearly) collinear; use a larger ridge");
  }
  return ok_status();
}

Status fit_affine_adapters(const float* x, const float* y, int64_t n, int32_t d, const std::vector<float>& ridges,
                           std::vector<AffineAdapter>* out) {
  return fit_affine_maps(x, d, y, d, n, ridges, out);
}

Status fit_affine_adapter(const float* x, const float* y, int64_t n, int32_t d, float ridge,
                          std::vector<float>* w, std::vector<float>* b) {
  std::vector<AffineAdapter> fits;
  HELIOS_RETURN_IF_ERROR(fit_affine_adapters(x, y, n, d, {ridge}, &fits));
  *w = std::move(fits[0].w);
  *b = std::move(fits[0].b);
  return ok_status();
}

Status fit_logistic_probe(const float* x, const uint8_t* labels, int64_t n, int32_t d, float l2,
                          int32_t iterations, std::vector<float>* w, float* b) {
  if (n < 1) return invalid_argument("fit_logistic_probe: needs at least 1 sample (got " + std::to_string(n) + ")");
  if (d <= 0) return invalid_argument("fit_logistic_probe: dimension must be > 0 (got " + std::to_string(d) + ")");
  if (!(l2 >= 0) || !std::isfinite(l2)) {
    return invalid_argument("fit_logistic_probe: l2 must be finite and >= 0 (got " + std::to_string(l2) + ")");
  }
  if (iterations < 1) {
    return invalid_argument("fit_logistic_probe: iterations must be >= 1 (got " + std::to_string(iterations) + ")");
  }
  HELIOS_RETURN_IF_ERROR(check_finite(x, n * d, "fit_logistic_probe: features x"));

  // Start from the base rate with w = 0. With one class only that is the answer; the clamp keeps
  // the bias finite (the probe then says "agree" or "disagree" with ~0.9999 confidence).
  int64_t n_positive = 0;
  for (int64_t i = 0; i < n; ++i) n_positive += labels[i] ? 1 : 0;
  constexpr double kMinRate = 1e-4;
  const double base_rate = std::clamp(static_cast<double>(n_positive) / static_cast<double>(n), kMinRate, 1 - kMinRate);
  std::vector<double> theta(static_cast<size_t>(d) + 1, 0.0);
  theta[d] = std::log(base_rate / (1 - base_rate));

  if (n_positive != 0 && n_positive != n) {
    // Newton's method with a backtracking line search: the objective is convex, so each step
    // that passes the Armijo test makes progress, and near the optimum it converges quadratically.
    const LogisticProblem problem{x, labels, n, d, static_cast<double>(l2)};
    std::vector<double> gradient, hessian, step, candidate(theta.size());
    double loss = problem.objective(theta);
    for (int32_t iter = 0; iter < iterations; ++iter) {
      problem.gradient_and_hessian(theta, &gradient, &hessian);
      if (!cholesky_in_place(hessian, d + 1)) {
        // Past the first step the Hessian loses rank only as |w| grows without bound (separable
        // data, l2 ~ 0): keep the best iterate reached.
        if (iter > 0) break;
        return invalid_argument("fit_logistic_probe: the Hessian is singular (n " + std::to_string(n) + ", d " +
                                std::to_string(d) + ", l2 " + std::to_string(l2) +
                                "): the features are (nearly) collinear or separable; use a larger l2");
      }
      step = gradient;
      cholesky_solve(hessian, d + 1, step.data(), 1);
      double decrement = 0;  // gradient · H^-1 gradient: twice the predicted loss reduction
      for (size_t j = 0; j < step.size(); ++j) decrement += gradient[j] * step[j];
      if (decrement < 1e-14) break;

      bool accepted = false;
      for (double t = 1.0; t > 1e-10; t *= 0.5) {
        for (size_t j = 0; j < theta.size(); ++j) candidate[j] = theta[j] - t * step[j];
        const double candidate_loss = problem.objective(candidate);
        if (candidate_loss <= loss - 1e-4 * t * decrement) {
          theta.swap(candidate);
          loss = candidate_loss;
          accepted = true;
          break;
        }
      }
      if (!accepted) break;  // no descent left at double precision: converged
    }
  }

  w->resize(d);
  for (int32_t j = 0; j < d; ++j) (*w)[j] = static_cast<float>(theta[j]);
  *b = static_cast<float>(theta[d]);
  return ok_status();
}

}  // namespace helios
