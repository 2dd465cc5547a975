// model_repository and groups: the paper's defaults, every key read, and errors that point at
// FILE:LINE:COLUMN and say what would be valid.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace helios::testing {
namespace {

constexpr const char* kRepository =
    "model_repository:\n"
    "  - name: small\n"
    "    path: /s.gguf\n"
    "    early_exit: {exits: [6, 12]}\n"
    "    telemetry: {throughput: 40, perplexity: 9.5, memory: 500MiB}\n"
    "  - name: big\n"
    "    path: /b.gguf\n";

TEST(GroupsConfig, DefaultsAreThePapers) {
  auto c = parse_config(std::string(kRepository) + "groups:\n  - name: coder\n", "cfg.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->models.empty()) << "a config of groups needs no models";
  ASSERT_EQ(c->model_repository.size(), 2u);
  EXPECT_EQ(c->model_repository[0].model.early_exit.exits.layers, (std::vector<int32_t>{6, 12}));
  EXPECT_DOUBLE_EQ(c->model_repository[0].telemetry.throughput_tok_s, 40);
  EXPECT_DOUBLE_EQ(c->model_repository[0].telemetry.perplexity, 9.5);
  EXPECT_EQ(c->model_repository[0].telemetry.memory_bytes, 500LL << 20);
  ASSERT_EQ(c->groups.size(), 1u);
  const ModelGroupConfig& g = c->groups[0];
  EXPECT_EQ(g.name, "coder");
  EXPECT_TRUE(g.candidates.empty()) << "empty = the whole repository";
  EXPECT_EQ(g.top_k, 3);
  EXPECT_EQ(g.memory_budget_bytes, 0);
  EXPECT_EQ(g.params.slo, SloMode::kThroughput);
  EXPECT_EQ(g.params.evaluation_requests, 5);
  EXPECT_EQ(g.params.cbc_window, 100);
  EXPECT_EQ(g.params.cbc_max, 50);
  EXPECT_EQ(g.params.reassess_every, 150);
  EXPECT_DOUBLE_EQ(g.params.prefix_coverage, 0.74);
}

TEST(GroupsConfig, EveryKeyIsRead) {
  auto c = parse_config(std::string(kRepository) +
                            "groups:\n"
                            "  - name: coder\n"
                            "    candidates: [big, small]\n"
                            "    slo: accuracy\n"
                            "    top_k: 2\n"
                            "    memory_budget: 3GiB\n"
                            "    measure: agreement\n"
                            "    threshold: 0.8\n"
                            "    evaluation_requests: 3\n"
                            "    prefix_coverage: 0.6\n"
                            "    cbc_window: 50\n"
                            "    cbc_max: 20\n"
                            "    reassess_every: 0\n",
                        "cfg.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const ModelGroupConfig& g = c->groups[0];
  EXPECT_EQ(g.candidates, (std::vector<std::string>{"big", "small"}));
  EXPECT_EQ(g.params.slo, SloMode::kAccuracy);
  EXPECT_EQ(g.top_k, 2);
  EXPECT_EQ(g.memory_budget_bytes, 3LL << 30);
  EXPECT_EQ(g.measure, ConfidenceMeasure::kAgreement);
  EXPECT_FLOAT_EQ(g.params.threshold, 0.8f);
  EXPECT_EQ(g.params.evaluation_requests, 3);
  EXPECT_DOUBLE_EQ(g.params.prefix_coverage, 0.6);
  EXPECT_EQ(g.params.cbc_window, 50);
  EXPECT_EQ(g.params.cbc_max, 20);
  EXPECT_EQ(g.params.reassess_every, 0);
}

TEST(GroupsConfig, ErrorsPointAtTheKey) {
  const std::string repo = kRepository;  // 7 lines: groups start at line 8
  EXPECT_EQ(config_error(repo + "groups:\n  - name: coder\n    candidates: [smal]\n"),
            "cfg.yaml:10:18: groups[0].candidates[0]: 'smal' is not in model_repository (it has small, big); did "
            "you mean 'small'?");
  EXPECT_TRUE(starts_with(config_error(repo + "groups:\n  - name: coder\n    slo: speed\n"),
                          "cfg.yaml:10:10: groups[0].slo: "));
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: coder\n    cbc_max: 100\n"),
                       "groups[0].cbc_max: must be between 0 and cbc_window - 1 (99), got 100"));
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: coder\n    threshold: 1.5\n"), "groups[0].threshold"));
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: coder\n    measure: entropy\n"), "groups[0].measure"));
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: coder\n    colour: red\n"), "groups[0]"));
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: a\n  - name: a\n"),
                       "groups[1].name: 'a' is already the name of groups[0]"));
  EXPECT_TRUE(contains(config_error("models:\n  - name: a\n    path: /a.gguf\n" + repo + "groups:\n  - name: a\n"),
                       "is also the name of a model in models"));
  EXPECT_TRUE(contains(config_error(repo + "  - name: small\n    path: /x.gguf\ngroups:\n  - name: g\n"),
                       "model_repository[2].name: 'small' is already the name of model_repository[0]"));
  EXPECT_TRUE(contains(config_error("model_repository:\n  - name: s\n    path: /s.gguf\n    telemetry: {speed: 1}\n"
                                    "groups:\n  - name: g\n"),
                       "model_repository[0].telemetry"));
  EXPECT_TRUE(contains(config_error("groups:\n  - name: g\n"), "model_repository is empty"));
  // Groups extend loaded prefixes; a model split over tensor-parallel ranks cannot.
  EXPECT_TRUE(contains(config_error(repo + "groups:\n  - name: g\nengine:\n  tensor_parallel: 2\n"),
                       "engine.tensor_parallel: a model group extends"));
  // A groups key with no group, and no models: nothing to serve.
  for (const char* empty : {"groups:\n", "groups: []\n", "groups:\n  # none yet\nengine: {block_size: 16}\n"}) {
    EXPECT_TRUE(starts_with(config_error(repo + empty), "cfg.yaml:8:"))
        << empty << ": " << config_error(repo + empty);
    EXPECT_TRUE(contains(config_error(repo + empty), "groups: has no group and there is no models section"));
  }
}

}  // namespace
}  // namespace helios::testing
