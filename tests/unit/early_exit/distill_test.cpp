// Distilled exit adapters: the gradient against finite differences, the teacher's top-k, and a
// fit that recovers a known map (the teacher's states are a fixed linear map of the exit's).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "helios/distill.h"

namespace helios {
namespace {

HostHead random_head(int32_t n_vocab, int32_t d, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  HostHead h;
  h.n_vocab = n_vocab;
  h.n_embd = d;
  h.rms_eps = 1e-5f;
  h.lm_head.resize(static_cast<size_t>(n_vocab) * d);
  for (auto& x : h.lm_head) x = 2.0f * normal(rng);
  h.norm.resize(d);
  for (auto& x : h.norm) x = 1.0f + 0.3f * normal(rng);
  return h;
}

std::vector<float> random_matrix(int64_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> m(n);
  for (auto& x : m) x = scale * normal(rng);
  return m;
}

// Random exit states and the teacher's targets from states made of them, fit and held out.
struct Problem {
  template <class TeacherStates>
  Problem(const HostHead& h, int64_t n_fit, int64_t n_held, TeacherStates teacher_states, std::mt19937& rng)
      : d(h.n_embd),
        x_fit(random_matrix(n_fit * d, 1.0f, rng)),
        x_held(random_matrix(n_held * d, 1.0f, rng)),
        t_fit(teacher_targets(h, teacher_states(x_fit, n_fit).data(), n_fit, 8)),
        t_held(teacher_targets(h, teacher_states(x_held, n_held).data(), n_held, 8)) {}
  std::vector<float> identity() const {
    std::vector<float> w(static_cast<size_t>(d) * d, 0.0f);
    for (int32_t i = 0; i < d; ++i) w[static_cast<size_t>(i) * d + i] = 1.0f;
    return w;
  }
  int32_t d;
  std::vector<float> x_fit, x_held;
  TeacherTargets t_fit, t_held;
};

TEST(Distill, TeacherTargetsAreTheTopKOfTheLastLayer) {
  std::mt19937 rng(3);
  const HostHead h = random_head(40, 8, rng);
  const std::vector<float> states = random_matrix(5 * 8, 1.0f, rng);
  const TeacherTargets t = teacher_targets(h, states.data(), 5, 6);
  ASSERT_EQ(t.n_rows(), 5);
  for (int64_t r = 0; r < 5; ++r) {
    float mass = 0;
    for (int k = 0; k < 6; ++k) {
      mass += t.probs[r * 6 + k];
      if (k > 0) {
        EXPECT_GE(t.probs[r * 6 + k - 1], t.probs[r * 6 + k]);
      }
    }
    EXPECT_LE(mass, 1.0f + 1e-5f);
    EXPECT_GT(mass, 0.0f);
  }
  // The identity head reproduces the teacher: its top-1 agrees everywhere.
  EXPECT_DOUBLE_EQ(evaluate_head(h, states.data(), t, {}, {}).agreement, 1.0);
}

TEST(Distill, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  const int32_t d = 6, n = 4;
  const HostHead h = random_head(30, d, rng);
  const std::vector<float> x = random_matrix(n * d, 1.0f, rng), last = random_matrix(n * d, 1.0f, rng);
  const TeacherTargets t = teacher_targets(h, last.data(), n, 5);
  std::vector<float> w = random_matrix(d * d, 0.4f, rng), b = random_matrix(d, 0.2f, rng);
  const std::vector<int64_t> rows = {0, 1, 2, 3};
  std::vector<float> gw, gb, unused_w, unused_b;
  adapter_loss_grad(h, x.data(), t, rows.data(), n, w, b, &gw, &gb);
  const float eps = 1e-2f;
  // The central difference of the loss in one parameter, against its gradient.
  auto check = [&](std::vector<float>& params, const std::vector<float>& grad, int i, const char* name) {
    const float keep = params[i];
    params[i] = keep + eps;
    const double up = adapter_loss_grad(h, x.data(), t, rows.data(), n, w, b, &unused_w, &unused_b);
    params[i] = keep - eps;
    const double down = adapter_loss_grad(h, x.data(), t, rows.data(), n, w, b, &unused_w, &unused_b);
    params[i] = keep;
    EXPECT_NEAR(grad[i], (up - down) / (2 * eps), 2e-3 + 2e-2 * std::fabs(grad[i])) << name << "[" << i << "]";
  };
  for (int i : {0, 7, 20, 35}) check(w, gw, i, "w");
  for (int i : {0, 3, 5}) check(b, gb, i, "b");
}

TEST(Distill, LearnsAMapTheIdentityMisses) {
  std::mt19937 rng(11);
  const int32_t d = 12, n_fit = 1500, n_held = 300;
  const HostHead h = random_head(64, d, rng);
  // The teacher's states are M x: a rotation-like mix the identity adapter gets wrong.
  const std::vector<float> m = random_matrix(d * d, 0.5f, rng);
  auto teacher_states = [&](const std::vector<float>& x, int64_t n) {
    std::vector<float> y(n * d, 0.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int32_t o = 0; o < d; ++o)
        for (int32_t i = 0; i < d; ++i) y[r * d + o] += m[o * d + i] * x[r * d + i];
    return y;
  };
  const Problem p(h, n_fit, n_held, teacher_states, rng);
  std::vector<float> w = p.identity(), b(d, 0.0f);
  DistillOptions opt;
  opt.epochs = 15;
  opt.batch_rows = 32;
  opt.learning_rate = 1e-2f;
  auto rep = distill_adapter(h, p.x_fit.data(), p.t_fit, p.x_held.data(), p.t_held, opt, &w, &b);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_LT(rep->held_kl_best, 0.5 * rep->held_kl_start);
  EXPECT_GT(rep->held_agreement_best, rep->held_agreement_start + 0.2);
  EXPECT_GT(rep->best_step, 0);
  // What it returns is the best step's head, measured again.
  const HeadFit again = evaluate_head(h, p.x_held.data(), p.t_held, w, b);
  EXPECT_NEAR(again.kl, rep->held_kl_best, 1e-9);
}

ResidualMlp random_mlp(int32_t hidden, int32_t d, std::mt19937& rng) {
  ResidualMlp mlp;
  mlp.hidden = hidden;
  mlp.gate = random_matrix(hidden * d, 0.5f, rng);
  mlp.up = random_matrix(hidden * d, 0.5f, rng);
  mlp.down = random_matrix(hidden * d, 0.5f, rng);
  return mlp;
}

TEST(Distill, MlpGradientMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int32_t d = 6, hidden = 5, n = 4;
  const HostHead h = random_head(30, d, rng);
  const std::vector<float> a = random_matrix(n * d, 1.0f, rng), last = random_matrix(n * d, 1.0f, rng);
  const TeacherTargets t = teacher_targets(h, last.data(), n, 5);
  ResidualMlp mlp = random_mlp(hidden, d, rng), grad, unused;
  const std::vector<int64_t> rows = {0, 1, 2, 3};
  mlp_loss_grad(h, a.data(), t, rows.data(), n, mlp, &grad);
  ASSERT_EQ(grad.hidden, hidden);
  const float eps = 1e-2f;
  auto check = [&](std::vector<float>& params, const std::vector<float>& g, int i, const char* name) {
    const float keep = params[i];
    params[i] = keep + eps;
    const double up = mlp_loss_grad(h, a.data(), t, rows.data(), n, mlp, &unused);
    params[i] = keep - eps;
    const double down = mlp_loss_grad(h, a.data(), t, rows.data(), n, mlp, &unused);
    params[i] = keep;
    EXPECT_NEAR(g[i], (up - down) / (2 * eps), 2e-3 + 2e-2 * std::fabs(g[i])) << name << "[" << i << "]";
  };
  for (int i : {0, 7, 19, 29}) {
    check(mlp.gate, grad.gate, i, "gate");
    check(mlp.up, grad.up, i, "up");
    check(mlp.down, grad.down, i, "down");
  }
  // The loss is the head's on a + MLP(a): the same as evaluate_head's on the same rows.
  const HeadFit fit = evaluate_head(h, a.data(), t, {}, {}, &mlp);
  EXPECT_NEAR(mlp_loss_grad(h, a.data(), t, rows.data(), n, mlp, &unused), fit.kl, 1e-5);
}

// The teacher's states are a nonlinear function of the exit's (each coordinate squared, signed):
// the best affine adapter falls short, and the residual MLP trained after it gets closer.
TEST(Distill, MlpLearnsWhatTheAffineAdapterCannot) {
  std::mt19937 rng(13);
  const int32_t d = 12, n_fit = 2000, n_held = 400;
  const HostHead h = random_head(64, d, rng);
  auto teacher_states = [&](const std::vector<float>& x, int64_t n) {
    std::vector<float> y(n * d);
    for (int64_t i = 0; i < n * d; ++i) y[i] = x[i] * std::fabs(x[i]);
    return y;
  };
  const Problem p(h, n_fit, n_held, teacher_states, rng);
  std::vector<float> w = p.identity(), b(d, 0.0f);
  DistillOptions opt;
  opt.epochs = 12;
  opt.batch_rows = 32;
  opt.learning_rate = 1e-2f;
  opt.rank = 0;
  auto affine = distill_adapter(h, p.x_fit.data(), p.t_fit, p.x_held.data(), p.t_held, opt, &w, &b);
  ASSERT_TRUE(affine.ok()) << affine.status().to_string();
  // The MLP's input: the distilled adapter's output rows.
  auto through = [&](const std::vector<float>& x, int64_t n) {
    std::vector<float> a(n * d);
    for (int64_t r = 0; r < n; ++r)
      for (int32_t o = 0; o < d; ++o) {
        float acc = b[o];
        for (int32_t i = 0; i < d; ++i) acc += w[o * d + i] * x[r * d + i];
        a[r * d + o] = acc;
      }
    return a;
  };
  const std::vector<float> a_fit = through(p.x_fit, n_fit), a_held = through(p.x_held, n_held);
  ResidualMlp mlp;
  opt.learning_rate = 3e-3f;
  opt.epochs = 20;
  auto rep = distill_mlp(h, a_fit.data(), p.t_fit, a_held.data(), p.t_held, opt, 48, &mlp);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  // It starts where the adapter ended (down starts at zero) and keeps its best step.
  EXPECT_NEAR(rep->held_kl_start, affine->held_kl_best, 1e-6);
  EXPECT_LT(rep->held_kl_best, 0.7 * rep->held_kl_start);
  EXPECT_GT(rep->held_agreement_best, affine->held_agreement_best + 0.05);
  EXPECT_NEAR(evaluate_head(h, a_held.data(), p.t_held, {}, {}, &mlp).kl, rep->held_kl_best, 1e-9);
  EXPECT_FALSE(distill_mlp(h, a_fit.data(), p.t_fit, a_held.data(), p.t_held, opt, 0, &mlp).ok());
}

TEST(Distill, RefusesAnAdapterOfTheWrongShape) {
  std::mt19937 rng(1);
  const HostHead h = random_head(10, 4, rng);
  const std::vector<float> x = random_matrix(8, 1.0f, rng);
  const TeacherTargets t = teacher_targets(h, x.data(), 2, 3);
  std::vector<float> w(9), b(4);
  EXPECT_FALSE(distill_adapter(h, x.data(), t, x.data(), t, DistillOptions{}, &w, &b).ok());
}

}  // namespace
}  // namespace helios
