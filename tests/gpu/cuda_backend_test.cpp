// The CUDA backend as the forward pass sees it: its matmul paths against the reference, its
// decision ops against the defaults, and the whole forward pass of stories260K on cuda vs cpu.
// Tolerances: F32 matmul 1e-5 · Σ|w·x| (cuBLAS SGEMM, no TF32); F16 and BF16 up to 8 rows as the
// 16-bit kernel test; F16 above 8 rows 2e-3 · Σ|w·x| (cuBLAS rounds the activations to half), BF16
// 1e-2 (to bfloat16: 8 bits of mantissa);
// quantized, up to cuda_gemv_max_rows rows, 1e-5 against the CPU backend's own product (activations
// rounded to 8 bits, the same integer sums), and above it as F16 (the same dequantized values,
// rounded to half);
// forward logits 1e-3 absolute on logits of magnitude ~10; greedy tokens identical.
#include <cmath>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "gpu/gpu_test_util.h"
#include "helios/backend.h"
#include "helios/generate.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "kernels/kernels.h"
#include "test_paths.h"

namespace helios {
namespace {

using gpu_test::normal_floats;

std::unique_ptr<Backend> cuda_backend() {
  auto b = make_backend("cuda", 0);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(*b) : nullptr;
}

// One model file loaded on the CPU backend and on a CUDA device, for their outputs side by side.
struct OnBothBackends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1), gpu = cuda_backend();
  std::unique_ptr<Model> on_cpu, on_gpu;

  ::testing::AssertionResult load(const std::string& path) {
    if (!gpu) return ::testing::AssertionFailure() << "no CUDA backend";
    auto a = Model::load(path, *cpu);
    auto b = Model::load(path, *gpu);
    if (!a.ok()) return ::testing::AssertionFailure() << "on the CPU: " << a.status().to_string();
    if (!b.ok()) return ::testing::AssertionFailure() << "on the GPU: " << b.status().to_string();
    on_cpu = std::move(*a);
    on_gpu = std::move(*b);
    return ::testing::AssertionSuccess();
  }
};

// y = W x through the backend, W uploaded in `type` (F32 or F16 bits).
std::vector<float> backend_matmul(Backend& be, const std::vector<float>& x, const void* w_host, size_t w_bytes,
                                  TensorType type, int32_t n_rows, int32_t n_in, int32_t n_out) {
  Buffer w(&be, (w_bytes + 3) / 4), dx(&be, x.size()), dy(&be, static_cast<size_t>(n_rows) * n_out);
  be.upload(w.data(), static_cast<const float*>(w_host), w_bytes / 4);
  be.upload(dx.data(), x.data(), x.size());
  be.matmul(dx.data(), WeightMatrix{w.data(), type, n_out, n_in}, n_rows, dy.data());
  std::vector<float> y(static_cast<size_t>(n_rows) * n_out);
  be.download(y.data(), dy.data(), y.size());
  return y;
}

TEST(CudaBackend, MatmulMatchesTheReference) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  const int32_t n_in = 576, n_out = 1536;
  const auto w = normal_floats(static_cast<size_t>(n_out) * n_in, 31, 0.05f);
  std::vector<uint16_t> wh(w.size());
  kernels::ref_f32_to_f16(w.data(), static_cast<int64_t>(w.size()), wh.data());
  std::vector<float> w_abs(w.size());
  std::vector<uint16_t> wh_abs(wh.size());
  for (size_t i = 0; i < w.size(); ++i) w_abs[i] = std::fabs(w[i]), wh_abs[i] = wh[i] & 0x7FFF;
  for (int32_t n_rows : {1, 5, 8, 9, 64}) {
    const auto x = normal_floats(static_cast<size_t>(n_rows) * n_in, 32 + n_rows);
    std::vector<float> x_abs(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_abs[i] = std::fabs(x[i]);
    std::vector<float> want(static_cast<size_t>(n_rows) * n_out), bound(want.size());
    kernels::ref_matmul(x.data(), w.data(), n_rows, n_in, n_out, want.data());
    kernels::ref_matmul(x_abs.data(), w_abs.data(), n_rows, n_in, n_out, bound.data());
    auto got = backend_matmul(*be, x, w.data(), w.size() * 4, TensorType::kF32, n_rows, n_in, n_out);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * bound[i]) << "F32 rows " << n_rows;

    kernels::ref_matmul_f16(x.data(), wh.data(), n_rows, n_in, n_out, want.data());
    kernels::ref_matmul_f16(x_abs.data(), wh_abs.data(), n_rows, n_in, n_out, bound.data());
    got = backend_matmul(*be, x, wh.data(), wh.size() * 2, TensorType::kF16, n_rows, n_in, n_out);
    const float rel = n_rows <= 8 ? 1e-5f : 2e-3f;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * bound[i]) << "F16 rows " << n_rows;

    std::vector<uint16_t> wb(w.size()), wb_abs(w.size());
    kernels::ref_f32_to_bf16(w.data(), static_cast<int64_t>(w.size()), wb.data());
    for (size_t i = 0; i < wb.size(); ++i) wb_abs[i] = wb[i] & 0x7FFF;
    kernels::ref_matmul_bf16(x.data(), wb.data(), n_rows, n_in, n_out, want.data());
    kernels::ref_matmul_bf16(x_abs.data(), wb_abs.data(), n_rows, n_in, n_out, bound.data());
    got = backend_matmul(*be, x, wb.data(), wb.size() * 2, TensorType::kBF16, n_rows, n_in, n_out);
    const float rel_bf16 = n_rows <= 8 ? 1e-5f : 1e-2f;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], rel_bf16 * bound[i]) << "BF16 rows " << n_rows;
    }
  }
}

// Quantized weights through the backend: the matrix-vector kernel up to 8 rows, then slices of
// Up to cuda_gemv_max_rows rows the 8-bit matrix-vector kernel; past them 16384 weight rows
// dequantized to f16 for cuBLAS at a time (n_out past one slice, so two run).
TEST(CudaBackend, QuantizedMatmulMatchesTheCpuBackendThenTheDequantizedReference) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  const int32_t n_in = 256, n_out = 16400;
  for (const TensorType type : {TensorType::kQ8_0, TensorType::kQ4_K, TensorType::kQ6_K}) {
    ASSERT_TRUE(be->supports_weight_type(type));
    const auto w = normal_floats(static_cast<size_t>(n_out) * n_in, 51, 0.05f);
    const int64_t row_bytes = tensor_row_bytes(type, n_in);
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes) * n_out);
    std::vector<float> values(w.size()), values_abs(w.size());
    ASSERT_TRUE(quantize_row(type, w.data(), q.data(), static_cast<int64_t>(w.size())).ok());
    ASSERT_TRUE(dequantize_row(type, q.data(), values.data(), static_cast<int64_t>(w.size())).ok());
    for (size_t i = 0; i < values.size(); ++i) values_abs[i] = std::fabs(values[i]);
    const int32_t gemv_rows = cuda_gemv_max_rows(type, n_in);  // Q8_0 32, Q4_K 64, Q6_K 40
    for (int32_t n_rows : {1, 8, 9, 40, 72}) {
      const bool gemv = n_rows <= gemv_rows;
      SCOPED_TRACE(std::string(tensor_type_name(type)) + " rows " + std::to_string(n_rows) +
                   (gemv ? " (8-bit activations)" : " (cuBLAS)"));
      const auto x = normal_floats(static_cast<size_t>(n_rows) * n_in, 52 + n_rows);
      std::vector<float> x_abs(x.size());
      for (size_t i = 0; i < x.size(); ++i) x_abs[i] = std::fabs(x[i]);
      std::vector<float> want(static_cast<size_t>(n_rows) * n_out), bound(want.size());
      if (gemv) {
        const auto t = static_cast<uint32_t>(type);
        std::vector<uint8_t> xq(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(t, n_in)));
        kernels::ref_quantize_activations(t, x.data(), n_rows, n_in, xq.data());
        kernels::ref_matmul_quantized(t, q.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, want.data());
      } else {
        kernels::ref_matmul(x.data(), values.data(), n_rows, n_in, n_out, want.data());
      }
      kernels::ref_matmul(x_abs.data(), values_abs.data(), n_rows, n_in, n_out, bound.data());
      const auto got = backend_matmul(*be, x, q.data(), q.size(), type, n_rows, n_in, n_out);
      const float rel = gemv ? 1e-5f : 2e-3f;
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * bound[i] + 1e-7f) << "element " << i;
    }
  }
}

// matmuls: the outputs that round their input alike share one rounding (of the most rows any
// reads), those of one type and row count one launch (the two F16 ones here), the others take
// their own path; every output has the bits of a matmul of its own plus its bias, whatever the
// order (a Q8_0 output between K-quant ones rounds into the same scratch).
TEST(CudaBackend, MatmulsOfOneInputGiveTheBitsOfSeparateProductsAndBiases) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  const int32_t n_in = 512, n_out = 96, n_rows = 5;
  struct Part {
    TensorType type;
    int32_t rows;
    bool biased;  // a bias on every row: added as the 8-bit kernel writes, or by add_rows after cuBLAS
  };
  const Part parts[] = {{TensorType::kQ4_K, 3, true}, {TensorType::kQ8_0, 5, false}, {TensorType::kQ6_K, 5, true},
                        {TensorType::kF16, 2, true},  {TensorType::kQ4_K, 0, true},  {TensorType::kF16, 2, false},
                        {TensorType::kBF16, 5, true}};
  const auto x = normal_floats(static_cast<size_t>(n_rows) * n_in, 61);
  Buffer dx(be.get(), x.size());
  be->upload(dx.data(), x.data(), x.size());
  const auto bias = normal_floats(n_out, 60);
  Buffer d_bias(be.get(), bias.size());
  be->upload(d_bias.data(), bias.data(), bias.size());
  auto bias_of = [&](size_t i) { return parts[i].biased ? d_bias.data() : nullptr; };
  std::vector<std::unique_ptr<Buffer>> weights, together, alone;
  std::vector<WeightMatrix> matrices;
  for (size_t i = 0; i < std::size(parts); ++i) {
    const auto w = normal_floats(static_cast<size_t>(n_out) * n_in, 62 + static_cast<uint32_t>(i), 0.05f);
    std::vector<uint8_t> bytes(static_cast<size_t>(tensor_row_bytes(parts[i].type, n_in)) * n_out);
    ASSERT_TRUE(quantize_row(parts[i].type, w.data(), bytes.data(), static_cast<int64_t>(w.size())).ok());
    weights.push_back(std::make_unique<Buffer>(be.get(), (bytes.size() + 3) / 4));
    be->upload(weights.back()->data(), reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
    matrices.push_back(WeightMatrix{weights.back()->data(), parts[i].type, n_out, n_in});
    together.push_back(std::make_unique<Buffer>(be.get(), static_cast<size_t>(n_rows) * n_out));
    alone.push_back(std::make_unique<Buffer>(be.get(), static_cast<size_t>(n_rows) * n_out));
  }
  be->matmuls(dx.data(), {{&matrices[0], parts[0].rows, together[0]->data(), bias_of(0)},
                          {&matrices[1], parts[1].rows, together[1]->data(), bias_of(1)},
                          {&matrices[2], parts[2].rows, together[2]->data(), bias_of(2)},
                          {&matrices[3], parts[3].rows, together[3]->data(), bias_of(3)},
                          {&matrices[4], parts[4].rows, together[4]->data(), bias_of(4)},
                          {&matrices[5], parts[5].rows, together[5]->data(), bias_of(5)},
                          {&matrices[6], parts[6].rows, together[6]->data(), bias_of(6)}});
  for (size_t i = 0; i < std::size(parts); ++i) {
    if (parts[i].rows == 0) continue;
    be->matmul(dx.data(), matrices[i], parts[i].rows, alone[i]->data());
    if (parts[i].biased) be->add_rows(alone[i]->data(), d_bias.data(), parts[i].rows, n_out);
  }
  for (size_t i = 0; i < std::size(parts); ++i) {
    SCOPED_TRACE(std::string(tensor_type_name(parts[i].type)) + ", " + std::to_string(parts[i].rows) + " rows");
    const size_t n = static_cast<size_t>(parts[i].rows) * n_out;
    std::vector<float> a(n), b(n);
    if (n == 0) continue;
    be->download(a.data(), together[i]->data(), n);
    be->download(b.data(), alone[i]->data(), n);
    EXPECT_EQ(a, b);
  }
  be->synchronize();
  EXPECT_TRUE(be->error().ok()) << be->error().to_string();
}

// norm_matmuls and swiglu_matmul round the products' input as the norm or SwiGLU writes it, and
// swiglu_matmul adds its product to the residual as it writes it: every output, the norm's floats
// and the residual sums have the bits of the ops run in turn. Fused: the
// 8-bit outputs read exactly the norm's rows (a Q8_0 output then rounds again, an F16 one reads
// the floats); in turn: an output reads more rows than the norm writes (exited tokens' rows), or no
// product takes 8 bits.
TEST(CudaBackend, FusedNormsAndSwigluGiveTheBitsOfTheOpsInTurn) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  const int32_t dim = 512, n_out = 96, n_rows = 3, n_max = 5;
  const float eps = 1e-5f;
  std::vector<std::unique_ptr<Buffer>> keep;
  auto device = [&](const std::vector<float>& host) {
    keep.push_back(std::make_unique<Buffer>(be.get(), host.size()));
    be->upload(keep.back()->data(), host.data(), host.size());
    return keep.back()->data();
  };
  auto host = [&](const float* p, size_t n) {
    std::vector<float> h(n);
    be->download(h.data(), p, n);
    return h;
  };
  auto matrix = [&](TensorType type, int32_t rows_out, int32_t n_in, uint32_t seed) {
    const auto w = normal_floats(static_cast<size_t>(rows_out) * n_in, seed, 0.05f);
    std::vector<uint8_t> bytes(static_cast<size_t>(tensor_row_bytes(type, n_in)) * rows_out);
    EXPECT_TRUE(quantize_row(type, w.data(), bytes.data(), static_cast<int64_t>(w.size())).ok());
    keep.push_back(std::make_unique<Buffer>(be.get(), (bytes.size() + 3) / 4));
    be->upload(keep.back()->data(), reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
    return WeightMatrix{keep.back()->data(), type, rows_out, n_in};
  };
  const WeightMatrix q4_k = matrix(TensorType::kQ4_K, n_out, dim, 71), q6_k = matrix(TensorType::kQ6_K, n_out, dim, 72),
                     q8_0 = matrix(TensorType::kQ8_0, n_out, dim, 73), f16 = matrix(TensorType::kF16, n_out, dim, 74);
  const auto x0 = normal_floats(static_cast<size_t>(n_max) * dim, 75), residual = normal_floats(x0.size(), 76);
  const auto norm_weight = normal_floats(dim, 77);
  const float* d_residual = device(residual);
  const float* d_norm = device(norm_weight);
  const size_t out_floats = static_cast<size_t>(n_max) * n_out;
  struct Case {
    const char* what;
    bool add;
    std::vector<std::pair<const WeightMatrix*, int32_t>> outputs;  // matrix, rows
  };
  const Case cases[] = {
      {"fused: Q4_K and Q6_K share the norm's rounding, Q8_0 and F16 beside them", false,
       {{&q4_k, n_rows}, {&q8_0, n_rows}, {&q6_k, n_rows}, {&f16, n_rows}}},
      {"fused, after the residual add", true, {{&q6_k, n_rows}, {&q4_k, 2}}},
      {"in turn: K/V rows past the norm's", false, {{&q4_k, n_rows}, {&q6_k, n_max}}},
      {"in turn: no 8-bit product", true, {{&f16, n_rows}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_LE(c.outputs.size(), 4u);
    float* fused_x = device(x0);
    float* plain_x = device(x0);
    float* fused_norm = device(std::vector<float>(x0.size(), -1.0f));
    float* plain_norm = device(std::vector<float>(x0.size(), -1.0f));
    std::vector<float*> fused_y, plain_y;
    std::vector<Backend::MatmulOutput> outs;
    for (const auto& [w, rows] : c.outputs) {
      fused_y.push_back(device(std::vector<float>(out_floats, -1.0f)));
      plain_y.push_back(device(std::vector<float>(out_floats, -1.0f)));
      outs.push_back({w, rows, fused_y.back(), nullptr});
    }
    auto pad = [&](size_t i) { return i < outs.size() ? outs[i] : Backend::MatmulOutput{&q4_k, 0, nullptr}; };
    // Norm rows past n_rows: the exited tokens' rows, normed beforehand.
    be->rmsnorm(fused_x + static_cast<int64_t>(n_rows) * dim, d_norm, n_max - n_rows, dim, eps,
                fused_norm + static_cast<int64_t>(n_rows) * dim);
    be->rmsnorm(plain_x + static_cast<int64_t>(n_rows) * dim, d_norm, n_max - n_rows, dim, eps,
                plain_norm + static_cast<int64_t>(n_rows) * dim);
    be->norm_matmuls(fused_x, c.add ? d_residual : nullptr, d_norm, n_rows, dim, eps, fused_norm,
                     {pad(0), pad(1), pad(2), pad(3)});
    if (c.add) {
      be->add_rmsnorm(plain_x, d_residual, d_norm, n_rows, dim, eps, plain_norm);
    } else {
      be->rmsnorm(plain_x, d_norm, n_rows, dim, eps, plain_norm);
    }
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      be->matmul(plain_norm, *c.outputs[i].first, c.outputs[i].second, plain_y[i]);
    }
    EXPECT_EQ(host(fused_x, x0.size()), host(plain_x, x0.size())) << "x";
    EXPECT_EQ(host(fused_norm, x0.size()), host(plain_norm, x0.size())) << "the norm";
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      const auto got = host(fused_y[i], out_floats);
      EXPECT_EQ(got, host(plain_y[i], out_floats)) << "output " << i;
      EXPECT_NE(got[0], -1.0f) << "output " << i << " was not written";
    }
  }
  // SwiGLU into the down projection, in place over gate, with and without the residual add: the
  // 8-bit kernel (rounded as SwiGLU writes, added as the product writes), the F16 one (added as it
  // writes), BF16 on it and past its rows (cuBLAS, then the ops in turn).
  const int32_t n_ff = dim;
  const WeightMatrix bf16 = matrix(TensorType::kBF16, n_out, dim, 80);
  for (const auto& [down, rows] :
       {std::pair{&q4_k, n_rows}, std::pair{&f16, n_rows}, std::pair{&bf16, n_rows}, std::pair{&bf16, 12}}) {
    for (const bool residual : {false, true}) {
      SCOPED_TRACE(std::string(tensor_type_name(down->type)) + ", " + std::to_string(rows) + " rows" +
                   (residual ? ", into the residual" : ""));
      const size_t n = static_cast<size_t>(rows) * n_ff, n_y = static_cast<size_t>(rows) * n_out;
      const auto gate = normal_floats(n, 78), up = normal_floats(n, 79), stream = normal_floats(n_y, 81);
      float* fused_gate = device(gate);
      float* plain_gate = device(gate);
      const float* d_up = device(up);
      float* fused_y = device(std::vector<float>(n_y, -1.0f));
      float* plain_y = device(std::vector<float>(n_y, -1.0f));
      float* fused_stream = device(stream);
      float* plain_stream = device(stream);
      be->swiglu_matmul(fused_gate, d_up, rows, fused_gate, *down, fused_y, residual ? fused_stream : nullptr);
      be->swiglu(plain_gate, d_up, static_cast<int64_t>(n), plain_gate);
      be->matmul(plain_gate, *down, rows, plain_y);
      if (residual) be->add(plain_stream, plain_y, static_cast<int64_t>(n_y));
      EXPECT_EQ(host(fused_gate, n), host(plain_gate, n)) << "swiglu";
      if (residual) {
        const auto got = host(fused_stream, n_y);
        EXPECT_EQ(got, host(plain_stream, n_y)) << "the residual";
        EXPECT_NE(got, stream) << "nothing added";
      } else {
        const auto got = host(fused_y, n_y);
        EXPECT_EQ(got, host(plain_y, n_y)) << "down";
        EXPECT_NE(got[0], -1.0f);
        EXPECT_EQ(host(fused_stream, n_y), stream) << "a residual not given was written";
      }
    }
  }
  be->synchronize();
  EXPECT_TRUE(be->error().ok()) << be->error().to_string();
}

// A Q4_K_M-like model (Q6_K for some matrices) through the forward pass on both backends: the
// CUDA backend's fused launches against the CPU backend's ops, logits of a prompt (every row)
// and of decode steps, and greedy tokens.
TEST(CudaBackend, QuantizedModelGivesTheCpuLogits) {
  HELIOS_REQUIRE_GPU();
  SyntheticModelSpec s;
  s.n_layer = 3;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_vocab = 600;
  s.type = TensorType::kQ4_K;
  s.q4_k_m = true;
  s.seed = 9;
  const std::string path = testing::temp_dir() + "/cuda_q4_k_m.gguf";
  ASSERT_TRUE(make_synthetic_model(s, path).ok());
  OnBothBackends both;
  ASSERT_TRUE(both.load(path));
  // A prompt's every row, then decode steps fed the same tokens on both.
  auto run = [&](Model& m) {
    std::vector<float> logits;
    auto kv = KvCacheStorage::create(m.backend(), m.config(), 16, 16);
    EXPECT_TRUE(kv.ok());
    if (!kv.ok()) return logits;
    BlockAllocator alloc(16);
    BlockTable table;
    EXPECT_TRUE(reserve_tokens(alloc, table, 40, 16));
    SequenceBatchEntry e;
    for (int i = 0; i < 30; ++i) e.tokens.push_back(1 + (i * 37) % 500);
    e.blocks = &table;
    e.logits = LogitsWanted::kAll;
    for (int32_t step = 0; step <= 8; ++step) {
      ForwardBatch batch;
      batch.seqs.push_back(e);
      auto r = m.forward(batch, *kv);
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      if (!r.ok()) return logits;
      logits.insert(logits.end(), r->logits.begin(), r->logits.end());
      e.start_pos += static_cast<int32_t>(e.tokens.size());
      e.tokens = {static_cast<TokenId>(3 + step * 41)};
      e.logits = LogitsWanted::kLast;
    }
    return logits;
  };
  const auto la = run(*both.on_cpu), lb = run(*both.on_gpu);
  ASSERT_FALSE(la.empty());
  EXPECT_TRUE(gpu_test::all_near(lb, la, 1e-4f, 1e-3f));
  GenerateOptions opt;
  opt.max_tokens = 24;
  opt.ignore_eos = true;
  const std::vector<TokenId> prompt = {1, 72, 101, 108, 108, 111};
  auto a = generate(*both.on_cpu, prompt, opt);
  auto b = generate(*both.on_gpu, prompt, opt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->tokens, a->tokens);
}

// No GPU needed: the rows up to which each weight type takes a matrix-vector kernel, where ⌈n/8⌉
// launches read about the bytes of a dequantization to f16 (b + 4 per value, b the blocks').
TEST(CudaGemvRows, QuantizedTypesFollowTheirBytesPerValue) {
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ4_0, 4096), 64);  // 0.5625 bytes per value
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ4_K, 4096), 64);
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ4_1, 4096), 56);  // 0.625
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ5_K, 4096), 48);  // 0.6875
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ6_K, 4096), 40);  // 0.8203
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ8_0, 4096), 32);  // 1.0625
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kF16, 4096), 8);
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kBF16, 4096), 8);
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kF32, 4096), 0);
  EXPECT_EQ(cuda_gemv_max_rows(TensorType::kQ4_K, 100), 0);  // not whole blocks
}

TEST(CudaBackend, DecisionOpsMatchTheDefaults) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  auto cpu = make_cpu_backend(1);
  const int32_t n_rows = 5, n_vocab = 49152;
  const auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, 41, 3.0f);
  Buffer d(be.get(), logits.size()), h(cpu.get(), logits.size());
  be->upload(d.data(), logits.data(), logits.size());
  cpu->upload(h.data(), logits.data(), logits.size());

  std::vector<int32_t> top1(n_rows), top1_cpu(n_rows);
  std::vector<float> p(n_rows), m(n_rows), e(n_rows), p_cpu(n_rows), m_cpu(n_rows), e_cpu(n_rows);
  be->exit_stats(d.data(), n_rows, n_vocab, top1.data(), p.data(), m.data(), e.data());
  cpu->exit_stats(h.data(), n_rows, n_vocab, top1_cpu.data(), p_cpu.data(), m_cpu.data(), e_cpu.data());
  EXPECT_EQ(top1, top1_cpu);
  EXPECT_TRUE(gpu_test::all_near(e, e_cpu, 0.0f, 1e-4f));

  EXPECT_GT(be->free_device_bytes(), 0u);
}

// The scratch a pass takes is taken before the KV cache is sized: free memory drops by about
// what a 2048-token pass over a quantized 7B layer needs, drawing 32 rows then takes nothing more,
// and a pass too large for the device is refused with RESOURCE_EXHAUSTED, leaving the backend
// without a fault (alloc's contract).
TEST(CudaBackend, ReserveScratchTakesThePassMemoryBeforeTheKvCache) {
  HELIOS_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  Buffer w(be.get(), 16);  // any device pointer: reserve_scratch reads the matrices' shapes alone
  PassShape pass{2048, {{w.data(), TensorType::kQ4_K, 11008, 4096}, {w.data(), TensorType::kQ6_K, 4096, 11008}},
                 32, 128, 32000};
  // Sampling's rows: 32 of them, each with 4 adjustments, over logits of 32000.
  const int32_t n_draws = 32, n_vocab = 32000;
  Buffer logits(be.get(), static_cast<size_t>(n_draws) * n_vocab);
  ASSERT_FALSE(logits.empty());
  const std::vector<float> flat(logits.size(), 0.5f);
  be->upload(logits.data(), flat.data(), flat.size());
  std::vector<kernels::SampleRow> rows(n_draws);
  std::vector<kernels::LogitAdjust> adjust(4 * n_draws);
  for (int32_t i = 0; i < n_draws; ++i) {
    rows[i] = {i, 0.8f, 0, 1.0f, 0.0f, 1.0f, 0.5, 4 * i, 4 * i + 4};
    for (int32_t a = 4 * i; a < 4 * i + 4; ++a) adjust[a] = {a, 1.0f, 0, 0.0f};
  }
  std::vector<int32_t> token(n_draws);
  std::vector<float> logprob(n_draws);
  // One row first, so that the sampling kernels are loaded (lazily, taking memory) before counting.
  be->sample_rows(logits.data(), n_vocab, rows.data(), 1, adjust.data(), 4, token.data(), logprob.data());
  const size_t before = be->free_device_bytes();
  ASSERT_TRUE(be->reserve_scratch(pass).ok());
  // activations, one dequantized slice and attention's splits
  const size_t want = 2048u * 11008 * 2 + 11008u * 4096 * 2 + 4 * kernels::paged_attention_workspace_bound(32, 128);
  EXPECT_GE(before - be->free_device_bytes(), want);
  const size_t after = be->free_device_bytes();
  EXPECT_TRUE(be->reserve_scratch(pass).ok());
  EXPECT_EQ(be->free_device_bytes(), after) << "a second call takes nothing more";
  be->sample_rows(logits.data(), n_vocab, rows.data(), n_draws, adjust.data(), 4 * n_draws, token.data(),
                  logprob.data());
  EXPECT_TRUE(be->error().ok()) << be->error().to_string();
  EXPECT_EQ(be->free_device_bytes(), after) << "sampling within the pass's rows took memory of its own";
  pass.n_tokens = 1 << 30;
  const Status huge = be->reserve_scratch(pass);
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted) << huge.to_string();
  EXPECT_NE(huge.message().find("max_batched_tokens"), std::string::npos) << huge.to_string();
  EXPECT_TRUE(be->error().ok()) << be->error().to_string();
}

std::string stories_path() {
  const std::string path = testing::stories260k_path();
  return std::filesystem::exists(path) ? path : "";
}

TEST(CudaBackend, Stories260KGivesTheCpuGreedyTokensAndLogits) {
  HELIOS_REQUIRE_GPU();
  const std::string path = stories_path();
  if (path.empty()) GTEST_SKIP() << "stories260K is not in " << testing::models_dir() << " (scripts/setup.sh makes it)";
  OnBothBackends both;
  ASSERT_TRUE(both.load(path));

  // Greedy from an empty prompt (llama2.c's reference story) and from a text prompt, in chunks.
  for (const std::string& text : {std::string(""), std::string("Once upon a time, Tom had a red ball")}) {
    const auto prompt = both.on_cpu->tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/false);
    GenerateOptions opt;
    opt.max_tokens = 200;
    opt.ignore_eos = true;
    opt.prefill_chunk_tokens = 4;
    auto a = generate(*both.on_cpu, prompt, opt);
    auto b = generate(*both.on_gpu, prompt, opt);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->tokens, a->tokens) << "prompt '" << text << "'";
  }

  // Logits of a mixed batch: a prompt prefill next to a second sequence's prompt, all rows.
  auto run = [&](Model& m) -> std::vector<float> {
    auto kv = KvCacheStorage::create(m.backend(), m.config(), 16, 16);
    EXPECT_TRUE(kv.ok());
    BlockAllocator alloc(16);
    BlockTable t0, t1;
    EXPECT_TRUE(reserve_tokens(alloc, t0, 40, 16));
    EXPECT_TRUE(reserve_tokens(alloc, t1, 9, 16));
    ForwardBatch batch;
    std::vector<TokenId> p0(40), p1(9);
    for (int i = 0; i < 40; ++i) p0[i] = 1 + (i * 37) % 500;
    for (int i = 0; i < 9; ++i) p1[i] = 1 + (i * 11) % 500;
    for (const auto& [tokens, table] : {std::pair{&p0, &t0}, std::pair{&p1, &t1}}) {
      SequenceBatchEntry e;  // every position's logits
      e.tokens = *tokens;
      e.blocks = table;
      e.logits = LogitsWanted::kAll;
      batch.seqs.push_back(std::move(e));
    }
    auto r = m.forward(batch, *kv);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->logits : std::vector<float>{};
  };
  const auto la = run(*both.on_cpu), lb = run(*both.on_gpu);
  ASSERT_FALSE(la.empty());
  EXPECT_TRUE(gpu_test::all_near(lb, la, 0.0f, 1e-3f));
}

}  // namespace
}  // namespace helios
