// Exit profiles counted by hand: agreement, threshold rows, the confidence bins, the agreement
// measure's rows from a head's curve, rows that left early left out, and the JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "helios/exit_profile.h"

namespace helios {
namespace {

// A pass of 4 rows over a 3-token vocabulary, observed at exits 2 and 4; the last layer's top-1
// of every row is token 1.
ForwardResult four_rows() {
  ForwardResult fr;
  fr.n_vocab = 3;
  fr.row_seq = {0, 0, 0, 0};
  fr.logits = {0, 5, 0, 0, 5, 0, 0, 5, 0, 0, 5, 0};
  fr.observed_layers = {2, 4};
  fr.observed = {{{1, 0.95f}, {0, 0.15f}, {1, 0.55f}, {2, 0.92f}},
                 {{1, 0.99f}, {1, 0.35f}, {1, 0.65f}, {-1, 0.0f}}};  // row 3 left before exit 4
  return fr;
}

TEST(ExitProfile, CountsAgreementThresholdsAndBins) {
  ExitObservations obs;
  obs.add_pass(four_rows());
  ASSERT_EQ(obs.n_tokens(), 3);  // the row that left early is not observed everywhere
  const ExitProfile p = build_exit_profile(obs, "teacher-forced", nullptr);
  ASSERT_EQ(p.layers.size(), 2u);
  const ExitLayerProfile& e2 = p.layers[0];
  EXPECT_EQ(e2.layer, 2);
  EXPECT_DOUBLE_EQ(e2.agreement, 2.0 / 3);  // rows 0 and 2 say 1; row 1 says 0
  // At 0.5: rows 0 and 2 leave (2 of 3), both agree.
  const ThresholdRow& half = e2.top1[4];
  EXPECT_FLOAT_EQ(half.threshold, 0.5f);
  EXPECT_DOUBLE_EQ(half.leaving, 2.0 / 3);
  EXPECT_DOUBLE_EQ(half.agreed, 1.0);
  EXPECT_DOUBLE_EQ(e2.top1.back().leaving, 0.0);  // nobody at 0.99
  EXPECT_DOUBLE_EQ(e2.top1.back().agreed, 1.0);
  // Bins: 0.15 in [0.1, 0.2) unchanged 0; 0.55 in [0.5, 0.6) unchanged 1; 0.95 in [0.9, 1].
  EXPECT_EQ(e2.bins[1].n, 1);
  EXPECT_DOUBLE_EQ(e2.bins[1].unchanged, 0.0);
  EXPECT_EQ(e2.bins[5].n, 1);
  EXPECT_DOUBLE_EQ(e2.bins[5].unchanged, 1.0);
  EXPECT_EQ(e2.bins[9].n, 1);
  EXPECT_TRUE(e2.agreement_measure.empty());
  EXPECT_DOUBLE_EQ(p.layers[1].agreement, 1.0);
}

TEST(ExitProfile, TheAgreementMeasureUsesEachHeadsCurve) {
  ExitObservations obs;
  obs.add_pass(four_rows());
  ExitHeadSet heads;
  ExitHeadParams h;
  h.layer = 2;
  h.curve_prob = {0.0f, 1.0f};
  h.curve_agreement = {0.0f, 0.5f};  // halves the top-1 probability
  heads.heads.push_back(h);
  const ExitProfile p = build_exit_profile(obs, "free-running", &heads);
  ASSERT_EQ(p.layers[0].agreement_measure.size(), p.layers[0].top1.size());
  EXPECT_DOUBLE_EQ(p.layers[0].agreement_measure[3].leaving, 1.0 / 3);  // only 0.95 / 2 reaches 0.4
  EXPECT_TRUE(p.layers[1].agreement_measure.empty());                   // no head at exit 4
  const auto j = nlohmann::json::parse(exit_profile_json({p}));
  EXPECT_EQ(j[0]["mode"], "free-running");
  EXPECT_EQ(j[0]["layers"][0]["bins"].size(), 10u);
  const std::string md = exit_profile_markdown({p});
  EXPECT_NE(md.find("## free-running (3 tokens)"), std::string::npos) << md;
  EXPECT_NE(md.find("`agreement` measure"), std::string::npos);
}

}  // namespace
}  // namespace helios
