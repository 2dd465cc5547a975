// Extending a model loaded with its first layers (Model::load_layers_range + append_layers): the
// extended model computes exactly what the model loaded that deep from the start computes, holds
// as many bytes, keeps a head at a depth still short of the model, and refuses depths that do not
// extend it, leaving itself as it was.
#include <gtest/gtest.h>

#include "helios/model.h"
#include "helios/model_tools.h"
#include "test_paths.h"
#include "unit/model/six_layer_model.h"

namespace helios {
namespace {

constexpr int32_t kLayers = testing::kSixLayers;

std::string six_layer_model() {
  static const std::string path = testing::write_six_layer_model(11, "six_layers_to_extend.gguf");
  return path;
}

struct Loaded {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::unique_ptr<Model> model;

  explicit Loaded(int32_t n_layers, std::vector<int32_t> exits = {}) {
    ModelLoadOptions o;
    o.n_layers = n_layers;
    auto m = Model::load(six_layer_model(), *backend, o);
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return;
    model = std::move(*m);
    EXPECT_TRUE(model->set_exits(exits, nullptr).ok());
  }
};

// The logits of every position of `tokens` under `rule`, on a fresh cache.
std::vector<float> logits_of(Model& model, const std::vector<TokenId>& tokens, ExitRule rule = {}) {
  auto kv = KvCacheStorage::create(model.backend(), model.kv_config(), 4, 16);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  BlockAllocator blocks(4);
  BlockTable table;
  EXPECT_TRUE(reserve_tokens(blocks, table, static_cast<int32_t>(tokens.size()), 16));
  ForwardBatch batch;
  SequenceBatchEntry e;
  e.tokens = tokens;
  e.blocks = &table;
  e.logits = LogitsWanted::kAll;
  e.exit = rule;
  batch.seqs.push_back(e);
  auto fr = model.forward(batch, *kv);
  EXPECT_TRUE(fr.ok()) << fr.status().message();
  return fr.ok() ? fr->logits : std::vector<float>{};
}

const std::vector<TokenId> kTokens = {1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};

TEST(ModelLayerExtension, ThreeLayersExtendedToSixComputeWhatSixLoadedComputes) {
  Loaded full(kLayers, {2, 4});
  Loaded grown(3, {2});
  ASSERT_TRUE(full.model && grown.model);
  const int64_t bytes_at_3 = grown.model->weights().n_bytes;
  EXPECT_LT(bytes_at_3, full.model->weights().n_bytes);

  auto extra = grown.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok()) << extra.status().message();
  EXPECT_EQ(extra->layers.size(), 3u);
  EXPECT_EQ(grown.model->n_layers_loaded(), 3) << "loading the blocks leaves the model alone";
  EXPECT_EQ(bytes_at_3 + extra->n_bytes, full.model->weights().n_bytes);
  ASSERT_TRUE(grown.model->append_layers(std::move(*extra), {2, 4}, nullptr).ok());

  EXPECT_EQ(grown.model->n_layers_loaded(), kLayers);
  EXPECT_EQ(grown.model->kv_config().n_layer, kLayers);
  EXPECT_EQ(grown.model->exit_layers(), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(grown.model->weights().n_bytes, full.model->weights().n_bytes);
  EXPECT_EQ(grown.model->weights().n_params, full.model->weights().n_params);
  const std::vector<float> want = logits_of(*full.model, kTokens);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(logits_of(*grown.model, kTokens), want) << "the full policy, every position";

  ExitRule per_token;
  per_token.policy = ExitPolicy::kPerToken;
  per_token.threshold = 0.2f;
  EXPECT_EQ(logits_of(*grown.model, kTokens, per_token), logits_of(*full.model, kTokens, per_token))
      << "the new exit point at 4 works as on the model loaded deep";
}

TEST(ModelLayerExtension, ADepthShortOfTheModelKeepsItsHeadAndExtendsAgain) {
  Loaded five(5, {2});
  Loaded grown(3, {2});
  ASSERT_TRUE(five.model && grown.model);
  auto to_five = grown.model->load_layers_range(5);
  ASSERT_TRUE(to_five.ok()) << to_five.status().message();
  ASSERT_TRUE(grown.model->append_layers(std::move(*to_five), {2, 3}, nullptr).ok());
  ExitRule at_depth;
  at_depth.policy = ExitPolicy::kFixedDepth;  // depth 0: the loaded depth, now 5
  EXPECT_TRUE(grown.model->check_exit_rule(at_depth).ok());
  EXPECT_EQ(logits_of(*grown.model, kTokens, at_depth), logits_of(*five.model, kTokens, at_depth));
  at_depth.depth = 3;
  EXPECT_TRUE(grown.model->check_exit_rule(at_depth).ok()) << "the old depth is an exit point now";

  auto to_six = grown.model->load_layers_range(kLayers);
  ASSERT_TRUE(to_six.ok()) << to_six.status().message();
  ASSERT_TRUE(grown.model->append_layers(std::move(*to_six), {}, nullptr).ok());
  Loaded full(kLayers);
  EXPECT_EQ(logits_of(*grown.model, kTokens), logits_of(*full.model, kTokens));
  EXPECT_EQ(grown.model->weights().n_bytes, full.model->weights().n_bytes);
}

TEST(ModelLayerExtension, DepthsThatDoNotExtendAreRefusedAndChangeNothing) {
  Loaded grown(3, {2});
  ASSERT_TRUE(grown.model);
  const int64_t bytes = grown.model->weights().n_bytes;
  for (int32_t depth : {0, 2, 3, kLayers + 1}) {
    auto extra = grown.model->load_layers_range(depth);
    EXPECT_EQ(extra.status().code(), StatusCode::kInvalidArgument) << "depth " << depth;
  }
  EXPECT_EQ(grown.model->append_layers(ModelWeights{}, {2}, nullptr).code(), StatusCode::kInvalidArgument)
      << "no blocks: the depth it has";

  auto extra = grown.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok()) << extra.status().message();
  const Status bad_exit = grown.model->append_layers(std::move(*extra), {2, 6}, nullptr);
  EXPECT_EQ(bad_exit.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_exit.message().find("exit layer 6"), std::string::npos) << bad_exit.message();
  EXPECT_EQ(grown.model->n_layers_loaded(), 3);
  EXPECT_EQ(grown.model->weights().n_bytes, bytes);
  EXPECT_EQ(grown.model->exit_layers(), (std::vector<int32_t>{2}));
  EXPECT_EQ(logits_of(*grown.model, kTokens), logits_of(*Loaded(3).model, kTokens)) << "still the 3-layer model";
}

TEST(ModelLayerExtension, RulesAreCheckedAgainstTheDepthToCome) {
  Loaded grown(3, {2});
  ASSERT_TRUE(grown.model);
  ExitRule fixed;
  fixed.policy = ExitPolicy::kFixedDepth;
  fixed.depth = 3;
  EXPECT_TRUE(grown.model->check_exit_rule(fixed).ok());
  EXPECT_EQ(grown.model->check_exit_rule_at(fixed, kLayers, {2}, nullptr).code(), StatusCode::kInvalidArgument)
      << "3 is neither an exit point nor the loaded depth at 6";
  EXPECT_TRUE(grown.model->check_exit_rule_at(fixed, kLayers, {2, 3}, nullptr).ok());
  ExitRule speculative;
  speculative.policy = ExitPolicy::kSelfSpeculative;
  speculative.depth = 2;
  EXPECT_TRUE(grown.model->check_exit_rule_at(speculative, kLayers, {2, 4}, nullptr).ok());
  EXPECT_FALSE(grown.model->check_exit_rule_at(speculative, kLayers, {4}, nullptr).ok());
  ExitRule probe;
  probe.policy = ExitPolicy::kPerToken;
  probe.measure = ConfidenceMeasure::kProbe;
  EXPECT_FALSE(grown.model->check_exit_rule_at(probe, kLayers, {2, 4}, nullptr).ok()) << "no probes fitted";
}

}  // namespace
}  // namespace helios
