// The exit-heads sidecar: save → load round trips bit for bit, and every way a file can be
// wrong for the model gives an error that names the file and the difference.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "helios/early_exit.h"
#include "helios/gguf.h"
#include "test_paths.h"

namespace helios {
namespace {

constexpr int32_t kLayers = 6;
constexpr int32_t kEmbd = 8;

ModelConfig model_config(int32_t n_layer = kLayers, int32_t n_embd = kEmbd) {
  ModelConfig config;
  config.architecture = "llama";
  config.name = "tiny";
  config.n_layer = n_layer;
  config.n_embd = n_embd;
  return config;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Layer 1: identity with a probe; layer 3: adapter and probe; layer 5: adapter, no probe.
ExitHeadSet sample_set() {
  ExitHeadSet set;
  set.model_name = "tiny";
  set.n_layer = kLayers;
  set.n_embd = kEmbd;
  ExitHeadParams identity_head;
  identity_head.layer = 1;
  identity_head.probe_weight = random_floats(kEmbd, 1);
  identity_head.probe_bias = -0.75f;
  identity_head.agreement = 0.25f;
  identity_head.probe_accuracy = 0.8f;
  identity_head.n_tokens = 4096;
  ExitHeadParams full_head;
  full_head.layer = 3;
  full_head.adapter_weight = random_floats(kEmbd * kEmbd, 2);
  full_head.adapter_bias = random_floats(kEmbd, 3);
  full_head.probe_weight = random_floats(kEmbd, 4);
  full_head.probe_bias = 1.0f / 3.0f;
  full_head.agreement = 0.6f;
  full_head.probe_accuracy = 0.9f;
  full_head.n_tokens = (int64_t{1} << 33) + 7;  // more than 32 bits
  full_head.curve_prob = {0.1f, 0.5f, 0.9f};
  full_head.curve_agreement = {0.3f, 0.7f, 0.97f};
  full_head.kind = "mlp";
  full_head.mlp.hidden = 5;  // hidden != n_embd, so a swapped shape would show
  full_head.mlp.gate = random_floats(5 * kEmbd, 7);
  full_head.mlp.up = random_floats(5 * kEmbd, 8);
  full_head.mlp.down = random_floats(5 * kEmbd, 9);
  ExitHeadParams probeless_head;
  probeless_head.layer = 5;
  probeless_head.adapter_weight = random_floats(kEmbd * kEmbd, 5);
  probeless_head.adapter_bias = random_floats(kEmbd, 6);
  probeless_head.agreement = 0.95f;
  set.heads = {identity_head, full_head, probeless_head};
  return set;
}

std::string temp_path(const std::string& name) { return testing::temp_dir() + "/" + name; }

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
}

// Bit-for-bit equality, so that -0.0 vs 0.0 or a rounding in the round trip would show.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  if (a.empty()) return;  // memcmp of an empty vector's null data() is undefined
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// A minimal valid sidecar with one identity head at layer 2, for tests that break one thing.
GgufWriter minimal_writer() {
  GgufWriter w;
  w.set_string("general.architecture", "helios-exits");
  w.set_string("helios.exits.model_name", "tiny");
  w.set_uint32("helios.exits.n_layer", kLayers);
  w.set_uint32("helios.exits.n_embd", kEmbd);
  w.set_int32_array("helios.exits.layers", {2});
  w.set_float32("helios.exits.2.agreement", 0.5f);
  w.set_float32("helios.exits.2.probe_accuracy", 0.5f);
  w.set_uint64("helios.exits.2.n_tokens", 10);
  return w;
}

Status load_written(const GgufWriter& w, const std::string& name) {
  const std::string path = temp_path(name);
  Status written = w.write(path);
  if (!written.ok()) return written;
  return load_exit_heads(path, model_config()).status();
}

TEST(SidecarExitHeads, RoundTripIsBitExact) {
  const ExitHeadSet saved = sample_set();
  const std::string path = temp_path("roundtrip.exits.gguf");
  ASSERT_TRUE(save_exit_heads(saved, path).ok());
  auto loaded = load_exit_heads(path, model_config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->model_name, "tiny");
  EXPECT_EQ(loaded->n_layer, kLayers);
  EXPECT_EQ(loaded->n_embd, kEmbd);
  ASSERT_EQ(loaded->heads.size(), saved.heads.size());
  for (size_t i = 0; i < saved.heads.size(); ++i) {
    const ExitHeadParams& a = saved.heads[i];
    const ExitHeadParams& b = loaded->heads[i];
    SCOPED_TRACE("layer " + std::to_string(a.layer));
    EXPECT_EQ(b.layer, a.layer);
    expect_same_bits(b.adapter_weight, a.adapter_weight);
    expect_same_bits(b.adapter_bias, a.adapter_bias);
    expect_same_bits(b.probe_weight, a.probe_weight);
    EXPECT_EQ(b.probe_bias, a.probe_bias);
    EXPECT_EQ(b.agreement, a.agreement);
    EXPECT_EQ(b.probe_accuracy, a.probe_accuracy);
    EXPECT_EQ(b.n_tokens, a.n_tokens);
    EXPECT_EQ(b.kind, a.kind);
    expect_same_bits(b.curve_prob, a.curve_prob);
    expect_same_bits(b.curve_agreement, a.curve_agreement);
    EXPECT_EQ(b.mlp.hidden, a.mlp.hidden);
    expect_same_bits(b.mlp.gate, a.mlp.gate);
    expect_same_bits(b.mlp.up, a.mlp.up);
    expect_same_bits(b.mlp.down, a.mlp.down);
  }
}

// The residual MLP's tensors come as a set of three with matching shapes; anything else names
// what is wrong.
TEST(SidecarExitHeads, AnIncompleteOrMisshapenMlpIsRejected) {
  GgufWriter w = minimal_writer();
  ASSERT_TRUE(w.add_tensor("exit.2.mlp.gate", TensorType::kF32, {kEmbd, 3}, f32_bytes(random_floats(3 * kEmbd, 1))).ok());
  ASSERT_TRUE(w.add_tensor("exit.2.mlp.up", TensorType::kF32, {kEmbd, 3}, f32_bytes(random_floats(3 * kEmbd, 2))).ok());
  Status s = load_written(w, "half_mlp.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("mlp.down"), std::string::npos) << s.message();

  GgufWriter transposed = minimal_writer();
  for (const char* part : {"gate", "up"}) {
    ASSERT_TRUE(transposed.add_tensor(std::string("exit.2.mlp.") + part, TensorType::kF32, {kEmbd, 3},
                                      f32_bytes(random_floats(3 * kEmbd, 3))).ok());
  }
  ASSERT_TRUE(transposed.add_tensor("exit.2.mlp.down", TensorType::kF32, {kEmbd, 3},
                                    f32_bytes(random_floats(3 * kEmbd, 4))).ok());
  s = load_written(transposed, "transposed_mlp.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exit.2.mlp.down"), std::string::npos) << s.message();

  ExitHeadSet set = sample_set();
  set.heads[1].mlp.down.pop_back();
  const Status saved = save_exit_heads(set, temp_path("bad_mlp.exits.gguf"));
  ASSERT_FALSE(saved.ok());
  EXPECT_NE(saved.message().find("MLP"), std::string::npos) << saved.message();
}

// Files written before heads had a kind and an agreement curve load with the kind their adapter
// implies and no curve (the agreement measure then refuses them).
TEST(SidecarExitHeads, OlderFilesWithoutKindOrCurveLoad) {
  GgufWriter w = minimal_writer();
  const std::string path = temp_path("older.exits.gguf");
  ASSERT_TRUE(w.write(path).ok());
  auto loaded = load_exit_heads(path, model_config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->heads[0].kind, "identity");
  EXPECT_TRUE(loaded->heads[0].curve_prob.empty());
}

TEST(SidecarExitHeads, HalfACurveIsRejected) {
  GgufWriter w = minimal_writer();
  ASSERT_TRUE(w.add_tensor("exit.2.curve.prob", TensorType::kF32, {2}, f32_bytes({0.2f, 0.8f})).ok());
  const Status s = load_written(w, "halfcurve.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("curve.agreement"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, IdentityAndProbelessHeadsStayEmpty) {
  const std::string path = temp_path("empty_parts.exits.gguf");
  ASSERT_TRUE(save_exit_heads(sample_set(), path).ok());
  auto loaded = load_exit_heads(path, model_config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ExitHeadParams* identity = loaded->find(1);
  ASSERT_NE(identity, nullptr);
  EXPECT_TRUE(identity->adapter_weight.empty());
  EXPECT_TRUE(identity->adapter_bias.empty());
  EXPECT_FALSE(identity->probe_weight.empty());
  const ExitHeadParams* probeless = loaded->find(5);
  ASSERT_NE(probeless, nullptr);
  EXPECT_TRUE(probeless->probe_weight.empty());
  EXPECT_EQ(probeless->probe_bias, 0.0f);
  EXPECT_EQ(loaded->find(2), nullptr);
  EXPECT_EQ(loaded->find(6), nullptr);
}

TEST(SidecarExitHeads, EmptySetRoundTrips) {
  ExitHeadSet set;
  set.model_name = "tiny";
  set.n_layer = kLayers;
  set.n_embd = kEmbd;
  const std::string path = temp_path("no_heads.exits.gguf");
  ASSERT_TRUE(save_exit_heads(set, path).ok());
  auto loaded = load_exit_heads(path, model_config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_TRUE(loaded->heads.empty());
}

TEST(SidecarExitHeads, AdapterIsWrittenAsRowMajorOutIn) {
  const std::string path = temp_path("layout.exits.gguf");
  const ExitHeadSet saved = sample_set();
  ASSERT_TRUE(save_exit_heads(saved, path).ok());
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufTensorInfo* t = (*file)->find_tensor("exit.3.adapter.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, TensorType::kF32);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{kEmbd, kEmbd}));
  float out1_in2 = 0;  // row 1 (output 1), column 2 (input 2)
  std::memcpy(&out1_in2, t->data + (1 * kEmbd + 2) * sizeof(float), sizeof(float));
  EXPECT_EQ(out1_in2, saved.heads[1].adapter_weight[1 * kEmbd + 2]);
  EXPECT_EQ((*file)->get_string("general.architecture").value(), "helios-exits");
}

TEST(SidecarExitHeads, MismatchedModelNamesBothShapes) {
  const std::string path = temp_path("x.exits.gguf");
  ASSERT_TRUE(save_exit_heads(sample_set(), path).ok());
  auto loaded = load_exit_heads(path, model_config(22, 2048));
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(),
            path + ": fitted for a model with 6 layers and n_embd 8, but this model has 22 layers and n_embd 2048");
  EXPECT_FALSE(load_exit_heads(path, model_config(kLayers, 16)).ok());
  EXPECT_FALSE(load_exit_heads(path, model_config(7, kEmbd)).ok());
}

TEST(SidecarExitHeads, TruncatedFileIsACleanError) {
  const std::string path = temp_path("whole.exits.gguf");
  ASSERT_TRUE(save_exit_heads(sample_set(), path).ok());
  const std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 64u);
  const std::string truncated = temp_path("truncated.exits.gguf");
  for (size_t n : {size_t{0}, size_t{10}, bytes.size() / 3, bytes.size() - 1}) {
    SCOPED_TRACE("first " + std::to_string(n) + " bytes");
    write_bytes(truncated, bytes, n);
    auto loaded = load_exit_heads(truncated, model_config());
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find(truncated), std::string::npos) << loaded.status().message();
  }
}

TEST(SidecarExitHeads, MissingFileIsNotFound) {
  auto loaded = load_exit_heads(temp_path("no-such.exits.gguf"), model_config());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
}

TEST(SidecarExitHeads, ModelFileIsNotASidecar) {
  GgufWriter w = minimal_writer();
  w.set_string("general.architecture", "llama");
  const std::string path = temp_path("model.gguf");
  ASSERT_TRUE(w.write(path).ok());
  auto loaded = load_exit_heads(path, model_config());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(path), std::string::npos);
  EXPECT_NE(loaded.status().message().find("'llama'"), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("helios-exits"), std::string::npos);
}

TEST(SidecarExitHeads, MinimalFileLoads) {
  EXPECT_TRUE(load_written(minimal_writer(), "minimal.exits.gguf").ok());
}

TEST(SidecarExitHeads, LayerOutOfRangeIsNamed) {
  GgufWriter w = minimal_writer();
  w.set_int32_array("helios.exits.layers", {2, kLayers});
  Status s = load_written(w, "bad_layer.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exit layer 6"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, UnsortedLayersAreRejected) {
  GgufWriter w = minimal_writer();
  w.set_int32_array("helios.exits.layers", {2, 2});
  EXPECT_FALSE(load_written(w, "repeated.exits.gguf").ok());
}

TEST(SidecarExitHeads, WrongTensorShapeIsNamed) {
  GgufWriter w = minimal_writer();
  ASSERT_TRUE(w.add_tensor("exit.2.probe.weight", TensorType::kF32, {kEmbd - 1},
                           f32_bytes(std::vector<float>(kEmbd - 1, 0.5f))).ok());
  ASSERT_TRUE(w.add_tensor("exit.2.probe.bias", TensorType::kF32, {1}, f32_bytes({0.0f})).ok());
  Status s = load_written(w, "bad_shape.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exit.2.probe.weight"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[7]"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, WrongTensorTypeIsNamed) {
  GgufWriter w = minimal_writer();
  std::vector<uint8_t> f16(kEmbd * 2, 0);
  ASSERT_TRUE(w.add_tensor("exit.2.probe.weight", TensorType::kF16, {kEmbd}, f16).ok());
  ASSERT_TRUE(w.add_tensor("exit.2.probe.bias", TensorType::kF32, {1}, f32_bytes({0.0f})).ok());
  Status s = load_written(w, "bad_type.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("F16"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, HalfAnAdapterIsRejected) {
  GgufWriter w = minimal_writer();
  ASSERT_TRUE(w.add_tensor("exit.2.adapter.bias", TensorType::kF32, {kEmbd},
                           f32_bytes(std::vector<float>(kEmbd, 0.0f))).ok());
  Status s = load_written(w, "half_adapter.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exit.2.adapter.weight"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, TensorForAnUnlistedLayerIsRejected) {
  GgufWriter w = minimal_writer();
  ASSERT_TRUE(w.add_tensor("exit.4.probe.bias", TensorType::kF32, {1}, f32_bytes({0.0f})).ok());
  Status s = load_written(w, "stray.exits.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exit.4.probe.bias"), std::string::npos) << s.message();
}

TEST(SidecarExitHeads, NonFiniteParameterIsRejected) {
  GgufWriter w = minimal_writer();
  std::vector<float> weight(kEmbd, 0.0f);
  weight[3] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(w.add_tensor("exit.2.probe.weight", TensorType::kF32, {kEmbd}, f32_bytes(weight)).ok());
  ASSERT_TRUE(w.add_tensor("exit.2.probe.bias", TensorType::kF32, {1}, f32_bytes({0.0f})).ok());
  EXPECT_FALSE(load_written(w, "nan.exits.gguf").ok());
}

TEST(SidecarExitHeads, SaveRejectsInconsistentHeads) {
  ExitHeadSet set = sample_set();
  set.heads[1].adapter_bias.pop_back();
  EXPECT_EQ(save_exit_heads(set, temp_path("bad_save.exits.gguf")).code(), StatusCode::kInvalidArgument);
  set = sample_set();
  std::swap(set.heads[0], set.heads[1]);
  EXPECT_FALSE(save_exit_heads(set, temp_path("bad_save.exits.gguf")).ok());
  set = sample_set();
  set.heads[2].layer = kLayers;  // the model's own head is not an exit
  EXPECT_FALSE(save_exit_heads(set, temp_path("bad_save.exits.gguf")).ok());
}

}  // namespace
}  // namespace helios
