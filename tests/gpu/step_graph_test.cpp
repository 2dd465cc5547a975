// Decode steps replayed as CUDA graphs make what the same steps make op by op: a batch of
// sequences decoding greedily past the points where their launches change (the block table's
// stride and attention's sizing at 256 positions) gives bit-identical logits with graphs on and
// off, and most steps are replays.
#include <algorithm>
#include <filesystem>

#include "gpu/gpu_test_util.h"
#include "helios/backend.h"
#include "helios/kv_cache.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "kernels/kernels.h"
#include "test_paths.h"

namespace helios {
namespace {

struct Decoded {
  std::vector<float> logits;  // every step's rows, in order
  std::vector<TokenId> tokens;
  GraphCounters counters;
};

// n_seqs sequences, a prompt each, then `steps` greedy decode steps of all of them together; from
// step `plain_from` on (when given), plain launches instead of chained ones.
Decoded decode_batch(bool graphs, int32_t n_seqs, int32_t steps, int32_t plain_from = -1) {
  auto be = make_backend("cuda", 0);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return {};
  (*be)->set_graphs(graphs);
  auto m = Model::load(testing::stories260k_path(), **be);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  Model& model = **m;
  const int32_t block = 16, n_blocks = 128;
  auto kv = KvCacheStorage::create(model.backend(), model.config(), n_blocks, block);
  EXPECT_TRUE(kv.ok());
  BlockAllocator alloc(n_blocks);
  std::vector<BlockTable> tables(n_seqs);
  std::vector<int32_t> pos(n_seqs);
  std::vector<TokenId> next(n_seqs);
  Decoded out;
  auto take = [&](const ForwardResult& r) {
    for (int32_t s = 0; s < n_seqs; ++s) {
      const float* row = r.logits.data() + static_cast<size_t>(s) * r.n_vocab;
      next[s] = static_cast<TokenId>(std::max_element(row, row + r.n_vocab) - row);
      out.tokens.push_back(next[s]);
    }
    out.logits.insert(out.logits.end(), r.logits.begin(), r.logits.end());
  };
  auto entry = [](std::vector<TokenId> tokens, int32_t start, BlockTable* table) {
    SequenceBatchEntry e;
    e.tokens = std::move(tokens);
    e.start_pos = start;
    e.blocks = table;
    e.logits = LogitsWanted::kLast;
    return e;
  };
  ForwardBatch prefill;
  std::vector<std::vector<TokenId>> prompts(n_seqs);
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t i = 0; i < 5 + 3 * s; ++i) prompts[s].push_back(1 + (i * 37 + s * 101) % 500);
    pos[s] = static_cast<int32_t>(prompts[s].size());
    EXPECT_TRUE(reserve_tokens(alloc, tables[s], pos[s], block));
    prefill.seqs.push_back(entry(prompts[s], 0, &tables[s]));
  }
  auto r = model.forward(prefill, *kv);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  take(*r);
  for (int32_t step = 0; step < steps; ++step) {
    if (step == plain_from) kernels::set_chained_launches(false);
    ForwardBatch batch;
    for (int32_t s = 0; s < n_seqs; ++s) {
      EXPECT_TRUE(reserve_tokens(alloc, tables[s], pos[s] + 1, block));
      batch.seqs.push_back(entry({next[s]}, pos[s], &tables[s]));
      ++pos[s];
    }
    r = model.forward(batch, *kv);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return {};
    take(*r);
  }
  out.counters = (*be)->graph_counters();
  kernels::set_chained_launches(true);
  return out;
}

TEST(StepGraphs, ReplaysGiveTheLogitsOfStepsRunOpByOp) {
  HELIOS_REQUIRE_GPU();
  if (!std::filesystem::exists(testing::stories260k_path())) {
    GTEST_SKIP() << "stories260K is not in " << testing::models_dir() << " (scripts/setup.sh makes it)";
  }
  const int32_t n_seqs = 3, steps = 300;  // past 256 positions: the table's stride and attention's sizes change
  const Decoded eager = decode_batch(false, n_seqs, steps);
  const Decoded graphed = decode_batch(true, n_seqs, steps);
  ASSERT_EQ(eager.logits.size(), graphed.logits.size());
  ASSERT_FALSE(eager.logits.empty());
  size_t differ = 0;
  for (size_t i = 0; i < eager.logits.size(); ++i) differ += eager.logits[i] != graphed.logits[i];
  EXPECT_EQ(differ, 0u) << "of " << eager.logits.size() << " logits";
  EXPECT_EQ(graphed.tokens, eager.tokens);
  EXPECT_EQ(eager.counters.captured + eager.counters.replayed, 0);
  EXPECT_GE(graphed.counters.captured, 2);  // before and after the 256-position change
  EXPECT_GE(graphed.counters.replayed, steps - 20) << "captured " << graphed.counters.captured << ", run "
                                                  << graphed.counters.run;
}

// A step graph holds its launches as they went out, chained or plain: switching makes a graph of
// its own (captured anew, not the other kind replayed), with the same logits.
TEST(StepGraphs, ChainedAndPlainLaunchesAreGraphsOfTheirOwn) {
  HELIOS_REQUIRE_GPU();
  if (!std::filesystem::exists(testing::stories260k_path())) {
    GTEST_SKIP() << "stories260K is not in " << testing::models_dir() << " (scripts/setup.sh makes it)";
  }
  const int32_t n_seqs = 2, steps = 24;
  const Decoded eager = decode_batch(false, n_seqs, steps);
  const Decoded switched = decode_batch(true, n_seqs, steps, steps / 2);
  ASSERT_FALSE(eager.logits.empty());
  EXPECT_EQ(switched.logits, eager.logits);
  EXPECT_EQ(switched.counters.captured, 2) << "one graph of chained launches, one of plain ones";
}

}  // namespace
}  // namespace helios
