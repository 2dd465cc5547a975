// NCCL tensor parallelism: the communicator's collectives on one device (world size 1), and, where
// the machine has 2 or more devices, a model split over cuda:0..N-1 against the same model on
// cuda:0 — logits within float rounding, greedy tokens identical (the CPU's in-process group runs
// the same split in tests/unit/model/tensor_parallel_test.cpp).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "helios/generate.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "helios/tensor_parallel.h"
#include "test_paths.h"

namespace helios {
namespace {

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// One rank on cuda:0 with its NCCL communicator (world size 1).
class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    HELIOS_REQUIRE_GPU();
    auto backend = make_backend("cuda:0", 0);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    backend_ = std::move(*backend);
    auto comms = make_communicators({backend_.get()});
    ASSERT_TRUE(comms.ok()) << comms.status().to_string();
    ASSERT_EQ(comms->size(), 1u);
    comms_ = std::move(*comms);
  }
  std::unique_ptr<Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

TEST_F(NcclOneRank, ReducesAndGathersInPlace) {
  Backend& be = *backend_;
  Communicator& c = *comms_[0];
  EXPECT_EQ(c.world(), 1);

  const std::vector<float> host = gpu_test::normal_floats(3 * 40, 7);
  Buffer x(&be, host.size()), out(&be, 3 * 64);
  be.upload(x.data(), host.data(), host.size());
  c.all_reduce_sum(x.data(), host.size());
  std::vector<float> back(host.size());
  be.download(back.data(), x.data(), back.size());
  EXPECT_EQ(back, host) << "a sum over one rank is the rank's own data";

  // [3, 40] into columns [10, 50) of [3, 64]; the rest is zero.
  c.all_gather_columns(x.data(), 3, 40, 10, out.data(), 64);
  std::vector<float> gathered(3 * 64);
  be.download(gathered.data(), out.data(), gathered.size());
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 64; ++i) {
      const float want = i >= 10 && i < 50 ? host[r * 40 + (i - 10)] : 0.0f;
      EXPECT_EQ(gathered[r * 64 + i], want) << "row " << r << " column " << i;
    }
  }
  EXPECT_TRUE(be.error().ok()) << be.error().to_string();
}

// An aborted group's collectives return at once without an error of their own (the rank that
// aborted says why the pass failed), and reset() makes the communicators again for the next pass.
TEST_F(NcclOneRank, AbortReleasesTheCollectivesAndResetRestoresThem) {
  Backend& be = *backend_;
  Communicator& c = *comms_[0];
  const std::vector<float> host = gpu_test::normal_floats(100, 9);
  Buffer x(&be, host.size());
  be.upload(x.data(), host.data(), host.size());
  c.abort();
  c.abort();  // twice is once
  c.all_reduce_sum(x.data(), host.size());
  EXPECT_TRUE(c.error().ok()) << c.error().to_string();
  c.reset();
  c.all_reduce_sum(x.data(), host.size());
  std::vector<float> back(host.size());
  be.download(back.data(), x.data(), back.size());
  EXPECT_EQ(back, host);
  EXPECT_TRUE(c.error().ok()) << c.error().to_string();
  EXPECT_TRUE(be.error().ok()) << be.error().to_string();
}

TEST(NcclGroup, ModelSplitOverTheDevicesMatchesOneDevice) {
  HELIOS_REQUIRE_GPU();
  const int ranks = std::min(device_count(), 2);
  if (ranks < 2) GTEST_SKIP() << "one CUDA device: the split over devices needs two";
  SyntheticModelSpec s;
  s.n_layer = 3;
  s.n_embd = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_vocab = 700;
  s.type = TensorType::kQ4_K;
  s.seed = 5;
  const std::string path = testing::temp_dir() + "/nccl_tp.gguf";
  ASSERT_TRUE(make_synthetic_model(s, path).ok());
  auto b0 = make_backend("cuda:0", 0), b1 = make_backend("cuda:0", 0);
  ASSERT_TRUE(b0.ok() && b1.ok());
  auto one = Model::load(path, **b0);
  ModelLoadOptions opt;
  opt.tensor_parallel = ranks;
  opt.make_rank_backend = [](int32_t rank) { return make_backend("cuda:" + std::to_string(rank), 0); };
  auto split = Model::load(path, **b1, opt);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  const std::vector<TokenId> prompt = {1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
  GenerateOptions g;
  g.max_tokens = 16;
  g.ignore_eos = true;
  auto ga = generate(**one, prompt, g), gb = generate(**split, prompt, g);
  ASSERT_TRUE(ga.ok()) << ga.status().to_string();
  ASSERT_TRUE(gb.ok()) << gb.status().to_string();
  EXPECT_EQ(ga->tokens, gb->tokens);
}

}  // namespace
}  // namespace helios
