// Exit-rule evaluation on stories260K: the full baseline, self-speculative decoding matching it
// exactly with drafts confirmed, and the threshold extremes (0: every token at the first exit;
// 1: never early).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "helios/evaluate.h"
#include "stories_model.h"

namespace helios {
namespace {

struct Evaluated {
  testing::StoriesModel s;
  std::vector<EvalRow> rows;

  static Evaluated& get() {
    static Evaluated e = [] {
      Evaluated e;
      Model& m = *e.s.model;
      EXPECT_TRUE(m.set_exits({2, 3, 4}, nullptr).ok());
      const auto docs = testing::calibration_documents();
      const auto sequences = make_token_sequences(m.tokenizer(), docs, 64, 1024);
      std::vector<std::vector<TokenId>> prompts;
      for (size_t i = 0; i < 4; ++i) prompts.push_back(m.tokenizer().encode(docs[i].substr(0, 80), true, false));
      std::vector<ExitRule> rules;
      rules.push_back({ExitPolicy::kSelfSpeculative, ConfidenceMeasure::kTop1Prob, 0.0f, 2, 3});  // drafts always
      rules.push_back({ExitPolicy::kPerToken, ConfidenceMeasure::kTop1Prob, 0.0f});
      rules.push_back({ExitPolicy::kPerToken, ConfidenceMeasure::kTop1Prob, 1.0f});
      rules.push_back({ExitPolicy::kFixedDepth, ConfidenceMeasure::kTop1Prob, 0.9f, 3});
      rules.push_back({ExitPolicy::kPerToken, ConfidenceMeasure::kTop1Prob, 0.5f});
      EvalOptions opt;
      opt.gen_tokens = 24;
      auto rows = evaluate_exit_rules(m, rules, sequences, prompts, opt);
      EXPECT_TRUE(rows.ok()) << rows.status().to_string();
      if (rows.ok()) e.rows = std::move(*rows);
      return e;
    }();
    return e;
  }
};

TEST(Evaluate, FullComesFirstAsTheBaseline) {
  const auto& rows = Evaluated::get().rows;
  ASSERT_EQ(rows.size(), 6u);
  const EvalRow& full = rows[0];
  EXPECT_EQ(full.rule.policy, ExitPolicy::kFull);
  EXPECT_DOUBLE_EQ(full.agreement, 1.0);
  EXPECT_DOUBLE_EQ(full.identical, 1.0);
  EXPECT_DOUBLE_EQ(full.perplexity_increase_pct, 0.0);
  EXPECT_DOUBLE_EQ(full.mean_exit_layer, 5.0);
  EXPECT_DOUBLE_EQ(full.layers_per_token, 5.0);
  EXPECT_DOUBLE_EQ(full.head_rows_per_token, 1.0);
  EXPECT_GT(full.perplexity, 1.0);
  EXPECT_LT(full.perplexity, 512.0) << "better than uniform over the vocabulary";
  EXPECT_EQ(full.n_decoded, 4 * 23);
  EXPECT_GT(full.tokens_per_s, 0.0);
}

TEST(Evaluate, SelfSpeculativeAgreesWithFullEverywhere) {
  const EvalRow& r = Evaluated::get().rows[1];
  ASSERT_EQ(r.rule.policy, ExitPolicy::kSelfSpeculative);
  EXPECT_EQ(r.rule.depth, 2);
  // The generations really ran speculative rounds, some drafts were confirmed, and still every
  // token is full's.
  EXPECT_GT(r.drafted, 0);
  EXPECT_GT(r.accepted, 0) << "no draft at layer 2 was ever confirmed: the speculation did nothing";
  EXPECT_LE(r.accepted, r.drafted);
  EXPECT_DOUBLE_EQ(r.agreement, 1.0);
  EXPECT_DOUBLE_EQ(r.identical, 1.0);
  // Teacher-forced, every position is the full model's by definition (forward runs this policy
  // as full): the perplexity is full's and says nothing about the speculation.
  EXPECT_DOUBLE_EQ(r.perplexity, Evaluated::get().rows[0].perplexity);
}

TEST(Evaluate, ThresholdZeroLeavesEveryTokenAtTheFirstExit) {
  const EvalRow& r = Evaluated::get().rows[2];
  ASSERT_EQ(r.rule.policy, ExitPolicy::kPerToken);
  EXPECT_DOUBLE_EQ(r.mean_exit_layer, 2.0);
  EXPECT_DOUBLE_EQ(r.layers_per_token, 2.0);
  EXPECT_DOUBLE_EQ(r.fill_per_token, 3.0) << "layers 3..5 get the K/V of the exited state";
  EXPECT_NE(r.perplexity, Evaluated::get().rows[0].perplexity);
}

TEST(Evaluate, ThresholdOneNeverLeavesEarly) {
  const auto& rows = Evaluated::get().rows;
  const EvalRow& r = rows[3];
  EXPECT_DOUBLE_EQ(r.mean_exit_layer, 5.0);
  EXPECT_DOUBLE_EQ(r.layers_per_token, 5.0);
  EXPECT_DOUBLE_EQ(r.fill_per_token, 0.0);
  EXPECT_DOUBLE_EQ(r.perplexity, rows[0].perplexity);
  EXPECT_DOUBLE_EQ(r.agreement, 1.0);
}

TEST(Evaluate, FixedDepthAndAThresholdInBetween) {
  const auto& rows = Evaluated::get().rows;
  EXPECT_DOUBLE_EQ(rows[4].mean_exit_layer, 3.0);
  EXPECT_DOUBLE_EQ(rows[4].layers_per_token, 3.0);
  const EvalRow& mid = rows[5];
  EXPECT_GE(mid.mean_exit_layer, 2.0);
  EXPECT_LE(mid.mean_exit_layer, 5.0);
  EXPECT_GE(mid.agreement, rows[2].agreement) << "a higher threshold leaves later and agrees more";
}

TEST(Evaluate, ReportsAsMarkdownAndJson) {
  const auto& rows = Evaluated::get().rows;
  const std::string table = eval_table_markdown(rows, 5);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2 + static_cast<long>(rows.size()));
  EXPECT_NE(table.find("| full |"), std::string::npos);
  EXPECT_NE(table.find("| self-speculative |"), std::string::npos);
  const auto j = nlohmann::json::parse(eval_rows_json(rows, "m.gguf", 5, ""));
  ASSERT_EQ(j["rows"].size(), rows.size());
  EXPECT_EQ(j["rows"][0]["policy"], "full");
  EXPECT_EQ(j["rows"][2]["threshold"], 0.0);
  EXPECT_EQ(j["rows"][1]["depth"], 2);
}

TEST(Evaluate, RejectsRulesTheModelCannotRun) {
  testing::StoriesModel s;
  ASSERT_TRUE(s.model->set_exits({2}, nullptr).ok());
  ExitRule probe{ExitPolicy::kPerToken, ConfidenceMeasure::kProbe, 0.5f};
  auto rows = evaluate_exit_rules(*s.model, {probe}, {{1, 2, 3}}, {{1, 2}}, EvalOptions{});
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("probe"), std::string::npos);
}

}  // namespace
}  // namespace helios
