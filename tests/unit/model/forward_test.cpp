// The forward pass against a dense, unpaged reference written here from the formulas, and the
// invariances continuous batching relies on: a sequence's logits do not depend on which blocks it
// occupies, on how its prompt is chunked, or on what else is in the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "helios/gguf.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "gguf_copy.h"
#include "test_paths.h"

namespace helios {
namespace {

std::string synthetic_model(const std::string& name, bool rope_halves, int n_head_kv,
                            bool untied, TensorType type = TensorType::kF32, int n_embd = 64,
                            int n_ff = 96) {
  SyntheticModelSpec s;
  s.n_layer = 3;
  s.n_embd = n_embd;
  s.n_head = 4;
  s.n_head_kv = n_head_kv;
  s.n_ff = n_ff;
  s.n_vocab = 300;
  s.rope_halves = rope_halves;
  s.tied_output = !untied;
  s.type = type;
  s.seed = 11;
  const std::string path = testing::temp_dir() + "/" + name + ".gguf";
  EXPECT_TRUE(make_synthetic_model(s, path).ok());
  return path;
}

// Dense reference: row-major matrices [out, in], positions 0..n-1, no cache paging.
std::vector<float> dense_logits(const std::string& path, const std::vector<TokenId>& tokens) {
  auto file = GgufFile::open(path);
  auto cfg = model_config_from_gguf(**file);
  const ModelConfig& c = *cfg;
  auto tensor = [&](const std::string& name) {
    const GgufTensorInfo* t = (*file)->find_tensor(name);
    std::vector<float> v(t->n_elements());
    EXPECT_TRUE(dequantize_row(t->type, t->data, v.data(), t->n_elements()).ok());
    return v;
  };
  auto matvec = [](const std::vector<float>& w, const std::vector<float>& x, int n_out) {
    const int n_in = static_cast<int>(x.size());
    std::vector<float> y(n_out, 0.0f);
    for (int o = 0; o < n_out; ++o)
      for (int i = 0; i < n_in; ++i) y[o] += w[static_cast<size_t>(o) * n_in + i] * x[i];
    return y;
  };
  auto plus_bias = [&](std::vector<float> y, const std::string& name) {  // qwen2's Q/K/V biases
    if ((*file)->find_tensor(name)) {
      const auto b = tensor(name);
      for (size_t i = 0; i < y.size(); ++i) y[i] += b[i];
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<float>& x, const std::vector<float>& w) {
    double ss = 0;
    for (float v : x) ss += v * v;
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / x.size()) + c.rms_eps);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  };
  // Llama 3's per-pair divisors of the angle, where the file has them.
  const std::vector<float> factors = (*file)->find_tensor("rope_freqs.weight") ? tensor("rope_freqs.weight")
                                                                               : std::vector<float>(c.n_rot / 2, 1.0f);
  // Rope scaling, from the file's keys: linear divides every angle by the factor; YaRN (its paper,
  // section 3.2, with beta 32 and 1) keeps the angle of pairs that turn more than 32 times over the
  // original context, divides those that turn less than once, ramps between, and multiplies cos
  // and sin by 0.1 ln(factor) + 1. attn_factor multiplies them whatever the kind.
  auto key = [&](const std::string& k, double absent) {
    auto v = (*file)->get_float(c.architecture + ".rope.scaling." + k);
    return v.ok() ? *v : absent;
  };
  auto kind = (*file)->get_string(c.architecture + ".rope.scaling.type");
  const bool yarn = kind.ok() && *kind == "yarn";
  const auto older = (*file)->get_float(c.architecture + ".rope.scale_linear");
  const double factor = key("factor", older.ok() ? *older : 1.0);
  const double n_ctx_orig = key("original_context_length", *(*file)->get_float(c.architecture + ".context_length"));
  auto pair_turning = [&](double turns) {  // the pair that turns `turns` times over n_ctx_orig
    return c.n_rot * std::log(n_ctx_orig / (turns * 2 * M_PI)) / (2 * std::log(c.rope_freq_base));
  };
  const double low = std::max(0.0, std::floor(pair_turning(32))), high = std::min(c.n_rot - 1.0, std::ceil(pair_turning(1)));
  const double mscale = key("attn_factor", 1.0) * (yarn ? 0.1 * std::log(factor) + 1 : 1.0);
  auto rope = [&](std::vector<float>& v, int n_heads, int pos) {
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < c.n_rot / 2; ++i) {
        const double unscaled = pos * std::pow(c.rope_freq_base, -2.0 * i / c.n_rot) / factors[i];
        const double kept = yarn ? 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0) : 0.0;
        const double theta = unscaled / factor * (1 - kept) + unscaled * kept;
        const int a = c.rope_layout == RopeLayout::kInterleaved ? 2 * i : i;
        const int b = c.rope_layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + c.n_rot / 2;
        float* x = v.data() + h * c.head_dim;
        const float x0 = x[a], x1 = x[b];
        x[a] = static_cast<float>(mscale * (x0 * std::cos(theta) - x1 * std::sin(theta)));
        x[b] = static_cast<float>(mscale * (x0 * std::sin(theta) + x1 * std::cos(theta)));
      }
  };
  const auto embd = tensor("token_embd.weight");
  std::vector<std::vector<float>> xs;
  for (TokenId t : tokens) xs.emplace_back(embd.begin() + t * c.n_embd, embd.begin() + (t + 1) * c.n_embd);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto wq = tensor(p + "attn_q.weight"), wk = tensor(p + "attn_k.weight"),
               wv = tensor(p + "attn_v.weight"), wo = tensor(p + "attn_output.weight"),
               an = tensor(p + "attn_norm.weight"), fn = tensor(p + "ffn_norm.weight"),
               wg = tensor(p + "ffn_gate.weight"), wu = tensor(p + "ffn_up.weight"),
               wd = tensor(p + "ffn_down.weight");
    std::vector<std::vector<float>> q, k, v;
    for (size_t t = 0; t < xs.size(); ++t) {
      const auto h = rmsnorm(xs[t], an);
      q.push_back(plus_bias(matvec(wq, h, c.q_dim()), p + "attn_q.bias"));
      k.push_back(plus_bias(matvec(wk, h, c.kv_dim()), p + "attn_k.bias"));
      v.push_back(plus_bias(matvec(wv, h, c.kv_dim()), p + "attn_v.bias"));
      rope(q.back(), c.n_head, static_cast<int>(t));
      rope(k.back(), c.n_head_kv, static_cast<int>(t));
    }
    for (size_t t = 0; t < xs.size(); ++t) {
      std::vector<float> attn(c.q_dim(), 0.0f);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / (c.n_head / c.n_head_kv);
        std::vector<double> s(t + 1);
        double mx = -1e30, sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < c.head_dim; ++i) d += q[t][h * c.head_dim + i] * k[j][kvh * c.head_dim + i];
          s[j] = d / std::sqrt(static_cast<double>(c.head_dim));
          mx = std::max(mx, s[j]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (size_t j = 0; j <= t; ++j)
          for (int i = 0; i < c.head_dim; ++i)
            attn[h * c.head_dim + i] += static_cast<float>(s[j] / sum) * v[j][kvh * c.head_dim + i];
      }
      const auto o = matvec(wo, attn, c.n_embd);
      for (int i = 0; i < c.n_embd; ++i) xs[t][i] += o[i];
      const auto h2 = rmsnorm(xs[t], fn);
      auto g = matvec(wg, h2, c.n_ff);
      const auto u = matvec(wu, h2, c.n_ff);
      for (int i = 0; i < c.n_ff; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      const auto d = matvec(wd, g, c.n_embd);
      for (int i = 0; i < c.n_embd; ++i) xs[t][i] += d[i];
    }
  }
  const auto head = c.tied_output ? embd : tensor("output.weight");
  return matvec(head, rmsnorm(xs.back(), tensor("output_norm.weight")), c.n_vocab);
}

struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCacheStorage> kv;
  BlockAllocator allocator{64};

  explicit Fixture(const std::string& path, const ModelLoadOptions& options = {}) {
    auto m = Model::load(path, *backend, options);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    model = std::move(*m);
    auto s = KvCacheStorage::create(*backend, model->config(), 64, 4);
    kv = std::make_unique<KvCacheStorage>(std::move(*s));
  }
  // Logits after the whole sequence, run as the given chunks.
  std::vector<float> run(const std::vector<TokenId>& tokens, BlockTable& table,
                         const std::vector<size_t>& chunk_ends) {
    EXPECT_TRUE(reserve_tokens(allocator, table, static_cast<int32_t>(tokens.size()), 4));
    size_t begin = 0;
    std::vector<float> last;
    for (size_t end : chunk_ends) {
      ForwardBatch b;
      b.seqs.push_back({{tokens.begin() + begin, tokens.begin() + end}, static_cast<int32_t>(begin), &table, LogitsWanted::kLast});
      auto r = model->forward(b, *kv);
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      last.assign(r->row(0), r->row(0) + r->n_vocab);
      begin = end;
    }
    return last;
  }
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LE(worst, tol) << "largest logit difference";
}

const std::vector<TokenId> kTokens = {1, 70, 200, 45, 299, 3, 150, 150, 77, 12, 250, 9, 33};

class ForwardVsDense : public ::testing::TestWithParam<std::tuple<bool, int, bool>> {};

TEST_P(ForwardVsDense, MatchesTheDenseReference) {
  const auto [halves, kv_heads, untied] = GetParam();
  const std::string path = synthetic_model("dense_" + std::to_string(halves) + std::to_string(kv_heads) +
                                           std::to_string(untied), halves, kv_heads, untied);
  Fixture f(path);
  BlockTable table;
  const auto got = f.run(kTokens, table, {kTokens.size()});
  expect_close(got, dense_logits(path, kTokens), 2e-4f);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ForwardVsDense,
                         ::testing::Values(std::make_tuple(false, 4, false),  // MHA, interleaved
                                           std::make_tuple(false, 2, true),   // GQA, untied head
                                           std::make_tuple(true, 1, false))); // MQA, halves

// The synthetic model as a `qwen2` file: its keys under qwen2.*, no helios.rope.layout (qwen2
// rotates NeoX-style by itself) and seeded Q/K/V biases, or zero ones.
std::string as_qwen2(const std::string& llama_path, const std::string& name, float bias_scale) {
  auto file = GgufFile::open(llama_path);
  EXPECT_TRUE(file.ok());
  GgufWriter w;
  for (const std::string& key : (*file)->keys()) {
    if (key == "helios.rope.layout") continue;
    w.set_value(key.rfind("llama.", 0) == 0 ? "qwen2." + key.substr(6) : key, *(*file)->find(key));
  }
  w.set_string("general.architecture", "qwen2");
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    EXPECT_TRUE(w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes)).ok());
  }
  const ModelConfig c = *model_config_from_gguf(**file);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, bias_scale);
  for (int l = 0; l < c.n_layer; ++l) {
    for (const auto& [proj, n] : {std::pair{"q", c.q_dim()}, std::pair{"k", c.kv_dim()}, std::pair{"v", c.kv_dim()}}) {
      std::vector<float> b(n);
      for (float& x : b) x = bias_scale > 0 ? normal(rng) : 0.0f;
      std::vector<uint8_t> bytes(b.size() * sizeof(float));
      std::memcpy(bytes.data(), b.data(), bytes.size());
      const std::string t = "blk." + std::to_string(l) + ".attn_" + proj + ".bias";
      EXPECT_TRUE(w.add_tensor(t, TensorType::kF32, {n}, std::move(bytes)).ok());
    }
  }
  const std::string path = testing::temp_dir() + "/" + name + ".gguf";
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(Forward, Qwen2AddsItsBiasesAfterTheProjections) {
  const std::string llama = synthetic_model("qwen-base", /*rope_halves=*/true, 2, /*untied=*/true);
  const std::string qwen = as_qwen2(llama, "qwen2", 0.5f);
  auto config = model_config_from_gguf(**GgufFile::open(qwen));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "qwen2");
  EXPECT_EQ(config->rope_layout, RopeLayout::kHalves);
  EXPECT_EQ(config->n_head_kv, 2);
  Fixture f(qwen);
  BlockTable t1, t2;
  const auto got = f.run(kTokens, t1, {kTokens.size()});
  expect_close(got, dense_logits(qwen, kTokens), 2e-4f);
  expect_close(f.run(kTokens, t2, {5, 6, kTokens.size()}), got, 1e-4f);  // chunks and decodes too
  // Zero biases change nothing: the qwen2 file is then the llama one.
  Fixture zero(as_qwen2(llama, "qwen2-zero", 0.0f)), base(llama);
  BlockTable t3, t4;
  expect_close(zero.run(kTokens, t3, {kTokens.size()}), base.run(kTokens, t4, {kTokens.size()}), 1e-5f);
}

TEST(ModelLoad, Qwen2BiasOfTheWrongShapeNamesTheTensor) {
  const std::string llama = synthetic_model("qwen-bad-base", true, 2, true);
  auto file = GgufFile::open(as_qwen2(llama, "qwen2-ok", 0.5f));
  ASSERT_TRUE(file.ok());
  GgufWriter w;
  for (const std::string& key : (*file)->keys()) w.set_value(key, *(*file)->find(key));
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    const bool bad = t.name == "blk.1.attn_k.bias";
    const std::vector<int64_t> dims = bad ? std::vector<int64_t>{t.dims[0] / 2} : t.dims;
    const size_t n_bytes = bad ? t.n_bytes / 2 : t.n_bytes;
    ASSERT_TRUE(w.add_tensor(t.name, t.type, dims, std::vector<uint8_t>(t.data, t.data + n_bytes)).ok());
  }
  const std::string path = testing::temp_dir() + "/qwen2-bad.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(path, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("blk.1.attn_k.bias"), std::string::npos) << m.status().message();
}

TEST(Forward, ChunkedPrefillAndDecodeEqualOnePass) {
  Fixture f(synthetic_model("chunks", false, 2, false));
  BlockTable a, b;
  const auto whole = f.run(kTokens, a, {kTokens.size()});
  const auto chunked = f.run(kTokens, b, {3, 4, 9, 10, 11, 12, kTokens.size()});
  expect_close(chunked, whole, 1e-4f);
}

TEST(Forward, ScatteredBlocksGiveTheSameLogits) {
  Fixture f(synthetic_model("scatter", false, 2, false));
  BlockTable contiguous;
  const auto expected = f.run(kTokens, contiguous, {kTokens.size()});
  BlockTable scattered;
  scattered.block_ids = {40, 7, 63, 22};  // 16 slots for 13 tokens, in no particular order
  ForwardBatch b;
  b.seqs.push_back({kTokens, 0, &scattered, LogitsWanted::kLast});
  auto r = f.model->forward(b, *f.kv);
  ASSERT_TRUE(r.ok());
  expect_close({r->row(0), r->row(0) + r->n_vocab}, expected, 1e-4f);
}

TEST(Forward, MixedBatchEqualsEachSequenceAlone) {
  Fixture f(synthetic_model("mixed", false, 2, false));
  const std::vector<std::vector<TokenId>> seqs = {
      {1, 5, 9, 200}, {1, 17}, {1, 100, 101, 102, 103, 104, 105, 106, 107}};
  std::vector<std::vector<float>> alone;
  for (const auto& s : seqs) {
    BlockTable t;
    alone.push_back(f.run(s, t, {s.size()}));
  }
  // Prefill all but the last token of seqs 0 and 1 first, then one batch that mixes their
  // single-token decodes with the whole prefill of seq 2.
  BlockTable t0, t1, t2;
  f.run(seqs[0], t0, {3});
  f.run(seqs[1], t1, {1});
  ASSERT_TRUE(reserve_tokens(f.allocator, t2, 9, 4));
  ForwardBatch b;
  b.seqs.push_back({{seqs[0][3]}, 3, &t0, LogitsWanted::kLast});
  b.seqs.push_back({seqs[2], 0, &t2, LogitsWanted::kAll});
  b.seqs.push_back({{seqs[1][1]}, 1, &t1, LogitsWanted::kLast});
  auto r = f.model->forward(b, *f.kv);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->row_seq.size(), 1u + 9u + 1u);
  auto row_of = [&](int entry, int pos) {  // entry: index in the batch
    for (size_t i = 0; i < r->row_seq.size(); ++i)
      if (r->row_seq[i] == entry && r->row_pos[i] == pos) return std::vector<float>(r->row(i), r->row(i) + r->n_vocab);
    ADD_FAILURE() << "no row for entry " << entry << " pos " << pos;
    return std::vector<float>();
  };
  expect_close(row_of(0, 3), alone[0], 1e-4f);
  expect_close(row_of(1, 8), alone[2], 1e-4f);
  expect_close(row_of(2, 1), alone[1], 1e-4f);
}

// A top1_only entry gets its rows' top-1 and probability from the device's statistics, the same
// as the logits a plain entry downloads say, and no logits; every row carries its top-1.
TEST(Forward, Top1OnlyRowsCarryTheLogitsTop1WithoutTheLogits) {
  Fixture f(synthetic_model("top1", false, 2, false));
  const std::vector<TokenId> a = {1, 5, 9, 200}, b = {1, 100, 101, 102, 103};
  BlockTable ta, tb, ta2, tb2;
  ASSERT_TRUE(reserve_tokens(f.allocator, ta, 4, 4));
  ASSERT_TRUE(reserve_tokens(f.allocator, tb, 5, 4));
  ASSERT_TRUE(reserve_tokens(f.allocator, ta2, 4, 4));
  ASSERT_TRUE(reserve_tokens(f.allocator, tb2, 5, 4));
  ForwardBatch plain, top1;
  plain.seqs.push_back({a, 0, &ta, LogitsWanted::kLast});
  plain.seqs.push_back({b, 0, &tb, LogitsWanted::kAll});
  top1.seqs.push_back({a, 0, &ta2, LogitsWanted::kLast});
  top1.seqs.push_back({b, 0, &tb2, LogitsWanted::kAll});
  top1.seqs[0].top1_only = true;
  auto want = f.model->forward(plain, *f.kv);
  auto got = f.model->forward(top1, *f.kv);
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->row_top1.size(), 1u + 5u);
  for (size_t r = 0; r < want->row_seq.size(); ++r) {
    const float* row = want->row(r);
    const auto best = static_cast<int32_t>(std::max_element(row, row + want->n_vocab) - row);
    EXPECT_EQ(want->row_top1[r], best) << "row " << r;
    EXPECT_EQ(got->row_top1[r], best) << "row " << r;
    double sum = 0;
    for (int32_t i = 0; i < want->n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - row[best]);
    EXPECT_NEAR(got->row_top1_prob[r], 1.0 / sum, 1e-5) << "row " << r;
  }
  // The top1_only row came without its logits; the plain entry's rows with theirs.
  EXPECT_TRUE(std::all_of(got->row(0), got->row(0) + got->n_vocab, [](float v) { return v == 0.0f; }));
  for (size_t r = 1; r < got->row_seq.size(); ++r) {
    expect_close(std::vector<float>(got->row(r), got->row(r) + got->n_vocab),
                 std::vector<float>(want->row(r), want->row(r) + want->n_vocab), 1e-4f);
  }
}

// Greedy decoding is batch-invariant where the arithmetic is: with quantized weights every row of
// a matmul is quantized and summed alone in a fixed order, so one token at a time, chunks and one
// pass give bit-identical logits. F32 weights go through BLAS (sgemv for one row, sgemm for
// several), which may round differently: there the tests above allow float rounding.
bool is_k_quant(TensorType type) { return tensor_type_traits(static_cast<uint32_t>(type))->block_elems == 256; }

TEST(Forward, QuantizedWeightsGiveBitIdenticalLogitsWhateverTheBatchShape) {
  for (TensorType type : {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1,
                          TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    // K-quant rows are whole super-blocks of 256 values.
    const int n_embd = is_k_quant(type) ? 256 : 64, n_ff = is_k_quant(type) ? 512 : 96;
    Fixture f(synthetic_model(std::string("invariant-") + tensor_type_name(type), false, 2, true, type, n_embd, n_ff));
    BlockTable a, b, c;
    const auto whole = f.run(kTokens, a, {kTokens.size()});
    std::vector<size_t> one_by_one;
    for (size_t i = 1; i <= kTokens.size(); ++i) one_by_one.push_back(i);
    EXPECT_EQ(f.run(kTokens, b, one_by_one), whole) << tensor_type_name(type);
    EXPECT_EQ(f.run(kTokens, c, {3, 4, 9, kTokens.size()}), whole) << tensor_type_name(type);
  }
}

// A quantized embedding table stays in the file's type, shared with a tied LM head (one copy, in
// the head's layout: Q4_K, and Q6_K with AVX-512, interleaved on the CPU): the lookup dequantizes each token's row, to
// exactly the floats dequantize_row gives.
TEST(ModelLoad, QuantizedEmbeddingTableIsKeptOnceAndGatheredRowByRow) {
  for (TensorType type : {TensorType::kQ8_0, TensorType::kQ5_1, TensorType::kQ4_K, TensorType::kQ6_K}) {
    SCOPED_TRACE(tensor_type_name(type));
    const std::string path = synthetic_model(std::string("embd-") + tensor_type_name(type), false, 2,
                                             /*untied=*/false, type, 256, 512);
    Fixture f(path);
    const ModelWeights& w = f.model->weights();
    EXPECT_EQ(w.tok_embd.view.type, type);
    EXPECT_EQ(w.output.view.data, w.tok_embd.view.data);
    EXPECT_EQ(w.output.view.type, type);
    EXPECT_TRUE(w.output.storage.empty());
    // Q4_K always; Q6_K where this build's interleaved kernel is the faster (AVX-512VL).
    const bool interleaved = kernels::ref_interleaved_pays(static_cast<uint32_t>(type));
    EXPECT_EQ(w.tok_embd.view.layout, interleaved ? WeightLayout::kInterleaved : WeightLayout::kRows);
    auto file = GgufFile::open(path);
    const GgufTensorInfo* t = (*file)->find_tensor("token_embd.weight");
    const int64_t row_bytes = tensor_row_bytes(type, 256);
    const std::vector<int32_t> tokens = {0, 299, 7, 7};
    std::vector<float> got(tokens.size() * 256, NAN), want(tokens.size() * 256);
    f.backend->embedding_rows(tokens.data(), static_cast<int32_t>(tokens.size()), w.tok_embd.view, got.data());
    for (size_t i = 0; i < tokens.size(); ++i) {
      ASSERT_TRUE(dequantize_row(type, t->data + tokens[i] * row_bytes, want.data() + i * 256, 256).ok());
    }
    EXPECT_EQ(got, want);
    BlockTable table;
    const auto logits = f.run(kTokens, table, {kTokens.size()});
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

// A Q4_K_M-like file mixes Q4_K and Q6_K; each matrix is multiplied in its own type, and the
// logits stay independent of the batch shape.
TEST(ModelLoad, Q4_KMMixKeepsEachMatrixInItsOwnType) {
  SyntheticModelSpec s;
  s.n_layer = 3;  // layer 2 is in the last eighth: its attn_v and ffn_down get Q6_K
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_vocab = 300;
  s.type = TensorType::kQ4_K;
  s.q4_k_m = true;
  const std::string path = testing::temp_dir() + "/q4_k_m.gguf";
  ASSERT_TRUE(make_synthetic_model(s, path).ok());
  Fixture f(path);
  const ModelWeights& w = f.model->weights();
  EXPECT_EQ(w.tok_embd.view.type, TensorType::kQ6_K);  // tied: the LM head's type
  EXPECT_EQ(w.output.view.data, w.tok_embd.view.data);
  EXPECT_EQ(w.layers[0].wv.view.type, TensorType::kQ4_K);
  EXPECT_EQ(w.layers[1].w_down.view.type, TensorType::kQ4_K);
  EXPECT_EQ(w.layers[2].wv.view.type, TensorType::kQ6_K);
  EXPECT_EQ(w.layers[2].w_down.view.type, TensorType::kQ6_K);
  EXPECT_EQ(w.layers[2].wq.view.type, TensorType::kQ4_K);
  BlockTable a, b;
  const auto whole = f.run(kTokens, a, {kTokens.size()});
  EXPECT_EQ(f.run(kTokens, b, {1, 2, 6, kTokens.size()}), whole);
}

TEST(Forward, RefusesMalformedBatches) {
  Fixture f(synthetic_model("bad", false, 2, false));
  BlockTable t;
  ASSERT_TRUE(reserve_tokens(f.allocator, t, 4, 4));
  ForwardBatch too_long;
  too_long.seqs.push_back({{1, 2, 3, 4, 5}, 0, &t, LogitsWanted::kLast});
  EXPECT_EQ(f.model->forward(too_long, *f.kv).status().code(), StatusCode::kInvalidArgument);
  ForwardBatch bad_token;
  bad_token.seqs.push_back({{1, 300}, 0, &t, LogitsWanted::kLast});
  auto s = f.model->forward(bad_token, *f.kv).status();
  EXPECT_NE(s.message().find("token id 300"), std::string::npos) << s.message();
  ForwardBatch empty;
  empty.seqs.push_back({{}, 0, &t, LogitsWanted::kLast});
  EXPECT_FALSE(f.model->forward(empty, *f.kv).ok());
  BlockTable outside;
  outside.block_ids = {64};
  ForwardBatch bad_block;
  bad_block.seqs.push_back({{1}, 0, &outside, LogitsWanted::kLast});
  EXPECT_FALSE(f.model->forward(bad_block, *f.kv).ok());
}

TEST(ModelLoad, RefusesOtherArchitecturesListingTheSupportedOnes) {
  GgufWriter w;
  w.set_string("general.architecture", "gemma3");
  const std::string path = testing::temp_dir() + "/gemma.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto backend = make_cpu_backend(1);
  auto m = Model::load(path, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("gemma3"), std::string::npos);
  EXPECT_NE(m.status().message().find("llama"), std::string::npos);
  EXPECT_NE(m.status().message().find("qwen2"), std::string::npos);
}

// A copy of the model at `path` with `extra` applied to its writer (keys and tensors added).
std::string with_extra(const std::string& path, const std::string& name, const std::function<void(GgufWriter&)>& extra) {
  const std::string out = testing::temp_dir() + "/" + name + ".gguf";
  testing::copy_gguf_with(path, out, extra);
  return out;
}

// Llama 3's scaling: the angle of pair i divided by rope_freqs.weight[i]. The pass matches the
// dense reference with the divisors, and they change the logits (it does not ignore them).
TEST(Forward, RopeFrequencyFactorsDivideEachPairsAngle) {
  for (const bool halves : {false, true}) {
    SCOPED_TRACE(halves ? "half-split pairs" : "interleaved pairs");
    const std::string base = synthetic_model("rope-freqs-base-" + std::to_string(halves), halves, 2, true);
    const int32_t n_pairs = 64 / 4 / 2;  // head_dim / 2
    const std::string scaled = with_extra(base, "rope-freqs-" + std::to_string(halves), [&](GgufWriter& w) {
      std::vector<float> f(n_pairs);
      for (int32_t i = 0; i < n_pairs; ++i) f[i] = i < n_pairs / 2 ? 1.0f : 1.0f + 3.5f * i;
      std::vector<uint8_t> bytes(f.size() * sizeof(float));
      std::memcpy(bytes.data(), f.data(), bytes.size());
      ASSERT_TRUE(w.add_tensor("rope_freqs.weight", TensorType::kF32, {n_pairs}, std::move(bytes)).ok());
    });
    const std::vector<TokenId> tokens = {1, 17, 250, 3, 99, 42, 7, 180, 5, 64, 12, 200};
    Fixture with(scaled), without(base);
    BlockTable t1, t2;
    const auto got = with.run(tokens, t1, {tokens.size()});
    expect_close(got, dense_logits(scaled, tokens), 2e-4f);
    const auto plain = without.run(tokens, t2, {tokens.size()});
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - plain[i]));
    EXPECT_GT(max_diff, 1e-3f) << "the factors changed nothing";
  }
}

// Linear rope scaling: every angle times 1 / factor, from rope.scaling.factor or the older
// rope.scale_linear; the pass matches the dense reference with the scaled angles.
TEST(Forward, LinearRopeScalingDividesEveryAngle) {
  const std::string base = synthetic_model("rope-linear-base", false, 2, true);
  const std::vector<TokenId> tokens = {1, 17, 250, 3, 99, 42, 7, 180, 5, 64, 12, 200};
  for (const bool older_key : {false, true}) {
    SCOPED_TRACE(older_key ? "rope.scale_linear" : "rope.scaling.type = linear");
    const std::string scaled = with_extra(base, "rope-linear-" + std::to_string(older_key), [&](GgufWriter& w) {
      if (older_key) {
        w.set_float32("llama.rope.scale_linear", 4.0f);
      } else {
        w.set_string("llama.rope.scaling.type", "linear");
        w.set_float32("llama.rope.scaling.factor", 4.0f);
      }
    });
    auto file = GgufFile::open(scaled);
    ASSERT_TRUE(file.ok());
    auto config = model_config_from_gguf(**file);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->rope_freq_scale, 0.25f);
    Fixture f(scaled);
    BlockTable table;
    expect_close(f.run(tokens, table, {tokens.size()}), dense_logits(scaled, tokens), 2e-4f);
  }
}

// YaRN: the pass matches the dense reference, which follows the paper from the file's keys, at
// positions long enough to turn the unscaled pairs more than once, with and without an explicit
// original context and attn_factor, on both pairings.
TEST(Forward, YarnRopeScalingMatchesThePaper) {
  for (const bool halves : {false, true}) {
    const std::string base = synthetic_model("rope-yarn-base-" + std::to_string(halves), halves, 2, true);
    std::vector<TokenId> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<TokenId>(1 + (i * 37) % 290));
    Fixture without(base);
    BlockTable t0;
    const auto plain = without.run(tokens, t0, {tokens.size()});
    for (const bool explicit_keys : {false, true}) {
      SCOPED_TRACE(std::string(halves ? "half-split" : "interleaved") +
                   (explicit_keys ? ", original context 64 and attn_factor 0.9" : ", defaults"));
      const std::string name = "rope-yarn-" + std::to_string(halves) + std::to_string(explicit_keys);
      const std::string scaled = with_extra(base, name, [&](GgufWriter& w) {
        w.set_string("llama.rope.scaling.type", "yarn");
        w.set_float32("llama.rope.scaling.factor", 8.0f);
        if (explicit_keys) {
          w.set_uint32("llama.rope.scaling.original_context_length", 64);
          w.set_float32("llama.rope.scaling.attn_factor", 0.9f);
        }
      });
      auto file = GgufFile::open(scaled);
      ASSERT_TRUE(file.ok());
      auto config = model_config_from_gguf(**file);
      ASSERT_TRUE(config.ok()) << config.status().to_string();
      EXPECT_EQ(config->rope_yarn_ext_factor, 1.0f);
      EXPECT_LT(config->rope_yarn_low, config->rope_yarn_high) << "the ramp spans pairs";
      Fixture f(scaled);
      BlockTable table;
      const auto got = f.run(tokens, table, {tokens.size()});
      expect_close(got, dense_logits(scaled, tokens), 2e-4f);
      float moved = 0;
      for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::fabs(got[i] - plain[i]));
      EXPECT_GT(moved, 1e-3f) << "the scaling changed nothing";
    }
  }
}

// An operator's rope scaling (ModelLoadOptions::rope_scaling, from YAML or --rope-scaling) does
// what the same keys in the file do, and `none` takes a file's away. YaRN serves its original
// context times its factor.
TEST(ModelLoad, RopeScalingSetAtLoadReplacesTheFiles) {
  const std::string base = synthetic_model("rope-override-base", true, 2, true);
  const std::string with_keys = with_extra(base, "rope-override-keys", [](GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_float32("llama.rope.scaling.factor", 4.0f);
    w.set_uint32("llama.rope.scaling.original_context_length", 2048);
  });
  const std::vector<TokenId> tokens = {1, 17, 250, 3, 99, 42, 7, 180, 5, 64, 12, 200, 33, 71};
  ModelLoadOptions yarn;
  yarn.rope_scaling = RopeScaling{"yarn", 4.0, 2048};
  Fixture from_file(with_keys), set_at_load(base, yarn), plain(base);
  EXPECT_EQ(from_file.model->config().n_ctx_train, 8192);
  EXPECT_EQ(set_at_load.model->config().n_ctx_train, 8192);
  EXPECT_EQ(plain.model->config().n_ctx_train, 2048);
  BlockTable t1, t2, t3;
  const auto scaled = from_file.run(tokens, t1, {tokens.size()});
  EXPECT_EQ(set_at_load.run(tokens, t2, {tokens.size()}), scaled);
  const auto unscaled = plain.run(tokens, t3, {tokens.size()});
  EXPECT_NE(unscaled, scaled);

  ModelLoadOptions none;
  none.rope_scaling = RopeScaling{"none", 1.0, 0};
  Fixture taken_away(with_keys, none);
  BlockTable t4;
  EXPECT_EQ(taken_away.run(tokens, t4, {tokens.size()}), unscaled);
  EXPECT_EQ(taken_away.model->config().n_ctx_train, 2048);

  auto backend = make_cpu_backend(1);
  ModelLoadOptions bad;
  bad.rope_scaling = RopeScaling{"longrope", 4.0, 0};
  auto refused = Model::load(base, *backend, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rope_scaling.type"), std::string::npos) << refused.status().message();
}

TEST(ModelLoad, RefusesRopeScalingItWouldIgnore) {
  const std::string base = synthetic_model("rope-scaling-base", false, 2, true);
  auto backend = make_cpu_backend(1);
  auto refused = [&](const std::string& path, const std::string& named) {
    auto m = Model::load(path, *backend);
    ASSERT_FALSE(m.ok()) << path;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("is not supported yet; supported: linear, yarn"), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find(named), std::string::npos) << m.status().message();
  };
  refused(with_extra(base, "rope-su", [](GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "su");
    w.set_float32("llama.rope.scaling.factor", 4.0f);
  }), "'su'");
  refused(with_extra(base, "rope-longrope", [](GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "longrope");
    w.set_float32("llama.rope.scale_linear", 2.0f);
  }), "longrope");
  // Scaling by 1 (or naming no scaling) changes nothing: such files load.
  for (const std::string& path :
       {with_extra(base, "rope-linear-1", [](GgufWriter& w) {
          w.set_string("llama.rope.scaling.type", "linear");
          w.set_float32("llama.rope.scaling.factor", 1.0f);
        }),
        with_extra(base, "rope-none", [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "none"); })}) {
    auto m = Model::load(path, *backend);
    EXPECT_TRUE(m.ok()) << path << ": " << m.status().message();
  }
}

TEST(ModelLoad, MissingFileIsNotFound) {
  auto backend = make_cpu_backend(1);
  auto m = Model::load("/nonexistent/model.gguf", *backend);
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace helios
