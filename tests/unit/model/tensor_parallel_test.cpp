// Tensor parallelism on the CPU: the in-process communicator, the shard plan, and a model split
// over 2 and 3 ranks against the same model on one — logits within float rounding (the row-parallel
// sums are added in another order), greedy tokens identical, the KV cache split by KV heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "helios/generate.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "helios/tensor_parallel.h"
#include "test_paths.h"

namespace helios {
namespace {

// Runs fn(rank) on `world` threads.
template <typename Fn>
void on_ranks(int32_t world, Fn fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

TEST(InProcessGroup, AllReduceGivesEveryRankTheSameSumInRankOrder) {
  constexpr int32_t kWorld = 3;
  auto comms = make_in_process_group(kWorld);
  const size_t n = 1001;  // chunks of unequal size
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(n));
  for (int32_t r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < n; ++i) data[r][i] = std::sin(static_cast<float>(i * (r + 3))) * (r == 1 ? 1e7f : 1.0f);
  }
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = (data[0][i] + data[1][i]) + data[2][i];
  for (int round = 0; round < 3; ++round) {  // the barrier is reusable
    auto copy = data;
    on_ranks(kWorld, [&](int32_t r) { comms[r]->all_reduce_sum(copy[r].data(), n); });
    for (int32_t r = 0; r < kWorld; ++r) {
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(copy[r][i], want[i]) << "rank " << r << " element " << i;
    }
  }
}

TEST(InProcessGroup, AllGatherPutsEachRanksColumnsAtItsOffset) {
  constexpr int32_t kWorld = 3;
  auto comms = make_in_process_group(kWorld);
  const int32_t rows = 4, widths[kWorld] = {5, 0, 3}, offsets[kWorld] = {0, 5, 5}, out_width = 8;
  std::vector<std::vector<float>> local(kWorld), out(kWorld, std::vector<float>(rows * out_width, -1.0f));
  for (int32_t r = 0; r < kWorld; ++r) {
    for (int32_t i = 0; i < rows * widths[r]; ++i) local[r].push_back(100.0f * r + static_cast<float>(i));
  }
  on_ranks(kWorld, [&](int32_t r) {
    comms[r]->all_gather_columns(local[r].data(), rows, widths[r], offsets[r], out[r].data(), out_width);
  });
  for (int32_t r = 0; r < kWorld; ++r) {
    for (int32_t row = 0; row < rows; ++row) {
      for (int32_t c = 0; c < 5; ++c) EXPECT_EQ(out[r][row * out_width + c], static_cast<float>(row * 5 + c));
      for (int32_t c = 0; c < 3; ++c) EXPECT_EQ(out[r][row * out_width + 5 + c], 200.0f + static_cast<float>(row * 3 + c));
    }
  }
}

TEST(InProcessGroup, AbortReleasesTheRanksWaitingForAFailedOne) {
  auto comms = make_in_process_group(2);
  std::vector<float> x(8, 1.0f);
  std::thread waiting([&] { comms[1]->all_reduce_sum(x.data(), x.size()); });  // rank 0 never comes
  comms[0]->abort();
  waiting.join();
  comms[0]->reset();
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  on_ranks(2, [&](int32_t r) { comms[r]->all_reduce_sum(r == 0 ? a.data() : b.data(), 8); });
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_EQ(b[7], 3.0f);
}

ModelConfig qwen_1_5b_shape() {
  ModelConfig c;
  c.name = "qwen-1.5b-shaped";
  c.n_layer = 28;
  c.n_embd = 1536;
  c.n_head = 12;
  c.n_head_kv = 2;
  c.head_dim = 128;
  c.n_ff = 8960;
  c.n_vocab = 151936;
  return c;
}

TEST(ShardPlan, SplitsKvHeadsWholeBlocksAndVocabularyRows) {
  const ModelConfig c = qwen_1_5b_shape();
  auto r0 = plan_shard(c, 0, 2, 256, 256);
  auto r1 = plan_shard(c, 1, 2, 256, 256);
  ASSERT_TRUE(r0.ok()) << r0.status().to_string();
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r0->kv_head0, 0);
  EXPECT_EQ(r0->kv_head1, 1);
  EXPECT_EQ(r1->head0, 6);
  EXPECT_EQ(r1->head1, 12);
  // 8960 = 35 blocks of 256: 17 and 18.
  EXPECT_EQ(r0->ff1, 17 * 256);
  EXPECT_EQ(r1->ff0, 17 * 256);
  EXPECT_EQ(r1->ff1, 8960);
  EXPECT_EQ(r0->vocab1 % 64, 0);
  EXPECT_EQ(r0->vocab1, r1->vocab0);
  EXPECT_EQ(r1->vocab1, 151936);
  const ModelConfig local = shard_config(c, *r1);
  EXPECT_EQ(local.q_dim(), 6 * 128);
  EXPECT_EQ(local.kv_dim(), 128);
  EXPECT_EQ(local.n_ff, 18 * 256);
  EXPECT_EQ(local.n_vocab, c.n_vocab);
}

TEST(ShardPlan, RefusesWhatDoesNotSplitNamingIt) {
  const ModelConfig c = qwen_1_5b_shape();
  auto too_many = plan_shard(c, 0, 3, 256, 256);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("KV heads"), std::string::npos) << too_many.status().message();
  ModelConfig odd = c;
  odd.n_head = 6;  // 3 query heads of 128 per rank: 384 columns, inside a 256-value block
  auto o = plan_shard(odd, 1, 2, 256, 256);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("output projection"), std::string::npos) << o.status().message();
  EXPECT_FALSE(plan_shard(c, 2, 2, 256, 256).ok()) << "rank outside the world";
  ModelConfig narrow = c;
  narrow.n_ff = 256;  // one block cannot go to two ranks
  EXPECT_FALSE(plan_shard(narrow, 0, 2, 256, 256).ok());
}

std::string tp_model(const std::string& name, TensorType type, bool q4_k_m, int32_t n_head, int32_t n_head_kv,
                     int32_t n_embd, int32_t n_ff, bool tied) {
  SyntheticModelSpec s;
  s.n_layer = 3;
  s.n_embd = n_embd;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.n_ff = n_ff;
  s.n_vocab = 700;  // not a multiple of 64: the last rank's head rows are ragged
  s.type = type;
  s.q4_k_m = q4_k_m;
  s.tied_output = tied;
  s.seed = 5;
  const std::string path = testing::temp_dir() + "/" + name + ".gguf";
  EXPECT_TRUE(make_synthetic_model(s, path).ok());
  return path;
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

Loaded load(const std::string& path, int32_t ranks) {
  Loaded out;
  out.backend = make_cpu_backend(1);
  ModelLoadOptions opt;
  opt.tensor_parallel = ranks;
  opt.make_rank_backend = [](int32_t) -> StatusOr<std::unique_ptr<Backend>> { return make_cpu_backend(1); };
  auto m = Model::load(path, *out.backend, opt);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (m.ok()) out.model = std::move(*m);
  return out;
}

// Every prompt position's logits (one pass, under `rule`), on a fresh cache.
std::vector<float> all_logits(Model& m, const std::vector<TokenId>& tokens, const ExitRule& rule = {}) {
  auto kv = m.create_kv(8, 16);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  BlockTable table;
  for (int32_t b = 0; b < 8; ++b) table.block_ids.push_back(b);
  ForwardBatch batch;
  SequenceBatchEntry e;
  e.tokens = tokens;
  e.blocks = &table;
  e.logits = LogitsWanted::kAll;
  e.exit = rule;
  batch.seqs.push_back(e);
  auto r = m.forward(batch, *kv);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->logits : std::vector<float>{};
}

struct TpCase {
  const char* name;
  TensorType type;
  bool q4_k_m;
  int32_t n_head, n_head_kv, n_embd, n_ff;
  bool tied;
  int32_t ranks;
};

class TensorParallelModel : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelModel, MatchesOneRank) {
  const TpCase& p = GetParam();
  const std::string path = tp_model(p.name, p.type, p.q4_k_m, p.n_head, p.n_head_kv, p.n_embd, p.n_ff, p.tied);
  Loaded one = load(path, 1), split = load(path, p.ranks);
  ASSERT_TRUE(one.model && split.model);
  EXPECT_EQ(split.model->tensor_parallel(), p.ranks);
  EXPECT_EQ(split.model->config().n_head, p.n_head) << "config() is the whole model's";
  EXPECT_LT(split.model->kv_config().n_head_kv, p.n_head_kv) << "each rank caches its own KV heads";

  const std::vector<TokenId> prompt = {1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66};
  const std::vector<float> a = all_logits(*one.model, prompt), b = all_logits(*split.model, prompt);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  float scale = 0;
  for (float v : a) scale = std::max(scale, std::fabs(v));
  // The partial sums make float rounding differ (~1e-7 of the logits, as with F32 weights). With
  // quantized weights that can, rarely, move one activation across an int8 rounding step, which
  // shifts its position's state by ~1e-3 and the positions after it through attention (seen on
  // the Q4_K_M mix: 1% of the largest logit); a wrong slice would be off by the logits' size.
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  const bool quantized = p.type != TensorType::kF32;
  EXPECT_LE(worst, (quantized ? 2e-2f : 1e-5f) * scale) << "max |logit difference| " << worst << " of " << scale;
  EXPECT_LT(split.model->weights().layers[0].wq.view.n_out, one.model->weights().layers[0].wq.view.n_out)
      << "rank 0 holds its query heads only";

  // Greedy decoding through the paged cache: the same tokens, full depth and at a fixed exit.
  for (ExitPolicy policy : {ExitPolicy::kFull, ExitPolicy::kFixedDepth}) {
    GenerateOptions g;
    g.max_tokens = 24;
    g.ignore_eos = true;
    g.exit.policy = policy;
    g.exit.depth = policy == ExitPolicy::kFixedDepth ? 2 : 0;
    for (Loaded* m : {&one, &split}) ASSERT_TRUE(m->model->set_exits({1, 2}, nullptr).ok());
    auto ga = generate(*one.model, prompt, g), gb = generate(*split.model, prompt, g);
    ASSERT_TRUE(ga.ok()) << ga.status().to_string();
    ASSERT_TRUE(gb.ok()) << gb.status().to_string();
    ASSERT_EQ(gb->tokens.size(), 24u);
    EXPECT_EQ(ga->exit_layers, gb->exit_layers);
    // Each token the split model picked is the one-rank model's greedy choice in the same context,
    // or within rounding of it (a synthetic model's flat distributions have near-ties): the one-rank
    // model teacher-forced along the split model's output.
    std::vector<TokenId> context = prompt;
    context.insert(context.end(), gb->tokens.begin(), gb->tokens.end() - 1);
    const std::vector<float> ref = all_logits(*one.model, context, g.exit);
    const size_t vocab = ref.size() / context.size();
    for (size_t i = 0; i < gb->tokens.size(); ++i) {
      const float* row = ref.data() + (prompt.size() - 1 + i) * vocab;
      const float best = *std::max_element(row, row + vocab);
      EXPECT_GE(row[gb->tokens[i]], best - (quantized ? 2e-2f : 1e-5f) * scale)
          << exit_policy_name(policy) << " token " << i << " (one rank's greedy output: " << ga->tokens[i] << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TensorParallelModel,
    ::testing::Values(TpCase{"tp_f32_gqa_untied", TensorType::kF32, false, 4, 2, 64, 96, false, 2},
                      TpCase{"tp_f32_three_ranks", TensorType::kF32, false, 6, 3, 96, 96, true, 3},
                      TpCase{"tp_q4k_m", TensorType::kQ4_K, true, 4, 2, 512, 512, true, 2},
                      TpCase{"tp_q4k_m_untied", TensorType::kQ4_K, true, 4, 2, 512, 512, false, 2},
                      TpCase{"tp_q4k_plain", TensorType::kQ4_K, false, 4, 2, 512, 512, true, 2},
                      TpCase{"tp_q6k_plain", TensorType::kQ6_K, false, 4, 2, 512, 512, true, 2},
                      TpCase{"tp_q4k_untied", TensorType::kQ4_K, false, 4, 2, 512, 512, false, 2},
                      TpCase{"tp_q8_0_uneven_kv", TensorType::kQ8_0, false, 6, 3, 96, 128, false, 2}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(TensorParallelModel, KvCacheHoldsEveryRanksHeadsAndSwapsThemAll) {
  const std::string path = tp_model("tp_kv", TensorType::kF32, false, 4, 2, 64, 96, true);
  Loaded one = load(path, 1), split = load(path, 2);
  auto kv1 = one.model->create_kv(4, 16);
  auto kv2 = split.model->create_kv(4, 16);
  ASSERT_TRUE(kv1.ok() && kv2.ok());
  EXPECT_EQ(kv2->n_shards(), 2);
  EXPECT_EQ(kv1->words_per_block(), kv2->words_per_block()) << "the same KV heads in all";
  std::vector<float> block(kv2->words_per_block());
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<float>(i);
  kv2->write_block(3, block.data());
  ASSERT_TRUE(kv2->grow(6).ok());
  EXPECT_EQ(kv2->shard(1).n_blocks(), 6);
  std::vector<float> back(block.size(), -1.0f);
  kv2->read_block(3, back.data());
  EXPECT_EQ(back, block);
  // A cache without the other ranks' shards is refused, not run half-split.
  auto plain = KvCacheStorage::create(split.model->backend(), split.model->kv_config(), 4, 16);
  ASSERT_TRUE(plain.ok());
  BlockTable table{{0}};
  ForwardBatch batch;
  SequenceBatchEntry e;
  e.tokens = {1, 2};
  e.blocks = &table;
  batch.seqs.push_back(e);
  auto r = split.model->forward(batch, *plain);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("create_kv"), std::string::npos) << r.status().message();
}

TEST(TensorParallelModel, LoadErrorsNameTheProblem) {
  const std::string path = tp_model("tp_errors", TensorType::kF32, false, 4, 2, 64, 96, true);
  auto backend = make_cpu_backend(1);
  ModelLoadOptions no_backends;
  no_backends.tensor_parallel = 2;
  auto a = Model::load(path, *backend, no_backends);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("backend for each rank"), std::string::npos);
  ModelLoadOptions three = no_backends;
  three.tensor_parallel = 3;
  three.make_rank_backend = [](int32_t) -> StatusOr<std::unique_ptr<Backend>> { return make_cpu_backend(1); };
  auto b = Model::load(path, *backend, three);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("KV heads"), std::string::npos) << b.status().message();
  // A split model is loaded whole: the model manager's prefix extension is refused.
  ModelLoadOptions two = three;
  two.tensor_parallel = 2;
  two.n_layers = 2;
  auto c = Model::load(path, *backend, two);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto extend = (*c)->load_layers_range(3);
  ASSERT_FALSE(extend.ok());
  EXPECT_NE(extend.status().message().find("tensor-parallel"), std::string::npos);
}

}  // namespace
}  // namespace helios
