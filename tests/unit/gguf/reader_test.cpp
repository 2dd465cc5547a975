// GgufWriter → GgufFile round trips: every key, value, type and tensor survives parse() and
// open(), the typed getters report missing keys and type mismatches, and v2 files load.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "gguf_test_util.h"
#include "helios/gguf.h"
#include "test_paths.h"

namespace helios {
namespace {

using gguf_test::kBigU64;
using gguf_test::kNumFillerTokens;
using gguf_test::RawGguf;

constexpr uint64_t kDefaultAlignment = 32;

struct ExpectedTensor {
  const char* name;
  TensorType type;
  std::vector<int64_t> dims;
  uint64_t offset_bytes;
  uint64_t n_bytes;
  std::vector<uint8_t> bytes;
};

// Offsets follow the writer's rule: each tensor starts at a multiple of 32 in the data section.
std::vector<ExpectedTensor> expected_tensors() {
  using gguf_test::quantized;
  using gguf_test::sample_floats;
  return {
      {"f32.weight", TensorType::kF32, {8, 2}, 0, 64, quantized(TensorType::kF32, sample_floats(16, 0.25f))},
      {"f16.weight", TensorType::kF16, {16}, 64, 32, quantized(TensorType::kF16, sample_floats(16, 0.5f))},
      {"q8_0.weight", TensorType::kQ8_0, {64, 3}, 96, 204, quantized(TensorType::kQ8_0, sample_floats(192, 0.1f))},
  };
}

std::vector<std::string> expected_tokens() {
  std::vector<std::string> tokens = {"<s>", "", "hello", " world", "\xc3\xbc"};
  for (int i = 0; i < kNumFillerTokens; ++i) tokens.push_back("tok_" + std::to_string(i));
  return tokens;
}

const std::vector<std::string> kExpectedKeys = {
    "general.architecture", "general.name", "test.empty_string", "test.u32", "test.i32",
    "test.i32_pos", "test.u64", "test.f32", "test.bool_true", "test.bool_false", "test.u8",
    "test.i8", "test.u16", "test.i16", "test.i64", "test.f64", "tokenizer.ggml.tokens",
    "test.int_array", "test.float_array", "test.empty_array", "test.bool_array", "test.nested"};

void expect_scalar(const GgufFile& f, const std::string& key, GgufType type, int64_t i64) {
  SCOPED_TRACE(key);
  const GgufValue* v = f.find(key);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, type);
  EXPECT_EQ(v->i64, i64);
  EXPECT_EQ(v->u64, static_cast<uint64_t>(i64));
}

void expect_scalars(const GgufFile& f) {
  expect_scalar(f, "test.u32", GgufType::kUint32, 4000000000LL);
  expect_scalar(f, "test.i32", GgufType::kInt32, -123456);
  expect_scalar(f, "test.i32_pos", GgufType::kInt32, 7);
  expect_scalar(f, "test.u64", GgufType::kUint64, static_cast<int64_t>(kBigU64));
  expect_scalar(f, "test.bool_true", GgufType::kBool, 1);
  expect_scalar(f, "test.bool_false", GgufType::kBool, 0);
  expect_scalar(f, "test.u8", GgufType::kUint8, 200);
  expect_scalar(f, "test.i8", GgufType::kInt8, -100);
  expect_scalar(f, "test.u16", GgufType::kUint16, 65000);
  expect_scalar(f, "test.i16", GgufType::kInt16, -30000);
  expect_scalar(f, "test.i64", GgufType::kInt64, -(int64_t{1} << 40));
  ASSERT_NE(f.find("test.f32"), nullptr);
  EXPECT_EQ(f.find("test.f32")->type, GgufType::kFloat32);
  EXPECT_EQ(f.find("test.f32")->f64, 0.15625);
  ASSERT_NE(f.find("test.f64"), nullptr);
  EXPECT_EQ(f.find("test.f64")->type, GgufType::kFloat64);
  EXPECT_EQ(f.find("test.f64")->f64, 1.0 / 3.0);
  ASSERT_NE(f.find("general.name"), nullptr);
  EXPECT_EQ(f.find("general.name")->type, GgufType::kString);
  EXPECT_EQ(f.find("general.name")->str, "tiny \xc3\xbc \xe2\x9c\x93");
  EXPECT_EQ(f.find("test.empty_string")->str, "");
}

void expect_arrays(const GgufFile& f) {
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufType::kArray);
  EXPECT_EQ(tokens->array_type, GgufType::kString);
  EXPECT_EQ(tokens->strings, expected_tokens());
  EXPECT_EQ(tokens->array_size(), expected_tokens().size());

  const GgufValue* ints = f.find("test.int_array");
  ASSERT_NE(ints, nullptr);
  EXPECT_EQ(ints->array_type, GgufType::kInt32);
  EXPECT_EQ(ints->ints, (std::vector<int64_t>{-1, 0, 1, 2147483647, -2147483648LL}));

  const GgufValue* floats = f.find("test.float_array");
  ASSERT_NE(floats, nullptr);
  EXPECT_EQ(floats->array_type, GgufType::kFloat32);
  EXPECT_EQ(floats->floats, (std::vector<double>{0.5f, -2.25f, 1e-30f, 3.4e38f}));

  const GgufValue* empty = f.find("test.empty_array");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->type, GgufType::kArray);
  EXPECT_EQ(empty->array_size(), 0u);

  const GgufValue* bools = f.find("test.bool_array");
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(bools->array_type, GgufType::kBool);
  EXPECT_EQ(bools->ints, (std::vector<int64_t>{1, 0, 1}));
}

void expect_nested(const GgufFile& f) {
  const GgufValue* nested = f.find("test.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->type, GgufType::kArray);
  EXPECT_EQ(nested->array_type, GgufType::kArray);
  ASSERT_EQ(nested->arrays.size(), 3u);
  EXPECT_EQ(nested->arrays[0].array_type, GgufType::kUint16);
  EXPECT_EQ(nested->arrays[0].ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested->arrays[1].array_type, GgufType::kInt8);
  EXPECT_EQ(nested->arrays[1].array_size(), 0u);
  EXPECT_EQ(nested->arrays[2].array_type, GgufType::kString);
  EXPECT_EQ(nested->arrays[2].strings, (std::vector<std::string>{"a", "bc"}));
}

// `base` is the first byte of the image the file was parsed or mapped from.
void expect_tensors(const GgufFile& f, const uint8_t* base) {
  const auto want = expected_tensors();
  ASSERT_EQ(f.tensors().size(), want.size());
  const uint64_t data_start = static_cast<uint64_t>(f.tensors()[0].data - base);
  EXPECT_EQ(data_start % kDefaultAlignment, 0u);
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.type, want[i].type);
    EXPECT_EQ(t.dims, want[i].dims);
    EXPECT_EQ(t.offset_bytes, want[i].offset_bytes);
    EXPECT_EQ(t.n_bytes, want[i].n_bytes);
    EXPECT_EQ(t.data, base + data_start + want[i].offset_bytes);
    ASSERT_EQ(want[i].bytes.size(), t.n_bytes);
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), want[i].bytes);
    EXPECT_EQ(f.find_tensor(want[i].name), &t);
  }
  EXPECT_EQ(f.find_tensor("missing.weight"), nullptr);
  EXPECT_EQ(f.tensors()[2].n_elements(), 192);
  EXPECT_EQ(f.tensors()[2].n_rows(), 3);
}

void expect_sample_contents(const GgufFile& f, const uint8_t* base) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), kDefaultAlignment);
  EXPECT_EQ(f.keys(), kExpectedKeys);
  expect_scalars(f);
  expect_arrays(f);
  expect_nested(f);
  expect_tensors(f, base);
}

TEST(GgufReaderRoundTrip, ParseRecoversEveryKeyValueAndTensor) {
  const std::vector<uint8_t> bytes = gguf_test::sample_file();
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "sample.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->file_size(), bytes.size());
  EXPECT_EQ((*file)->path(), "sample.gguf");
  expect_sample_contents(**file, bytes.data());
}

TEST(GgufReaderRoundTrip, HeaderBytesFollowTheGgufLayout) {
  const std::vector<uint8_t> bytes = gguf_test::sample_file();
  // magic, version 3, n_tensors 3, n_kv 22, then the first key's length and text.
  RawGguf want;
  want.header(3, 3, kExpectedKeys.size()).str("general.architecture");
  want.put<uint32_t>(static_cast<uint32_t>(GgufType::kString)).str("llama");
  ASSERT_GE(bytes.size(), want.size());
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.begin() + want.size()), want.bytes());
  EXPECT_EQ(bytes.size() % kDefaultAlignment, 0u);
}

TEST(GgufReaderRoundTrip, OpenMapsTheWrittenFile) {
  const std::string path = testing::temp_dir() + "/reader_roundtrip.gguf";
  ASSERT_TRUE(gguf_test::sample_writer().write(path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, gguf_test::sample_file());

  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->file_size(), on_disk.size());
  // The mapping's base is the data pointer minus its file position.
  const GgufTensorInfo& first = (*file)->tensors()[0];
  const uint64_t data_start = on_disk.size() - 320;  // 64 + 32 + 224 bytes of padded data
  expect_sample_contents(**file, first.data - data_start);
}

TEST(GgufReaderRoundTrip, AcceptsVersion2) {
  std::vector<uint8_t> bytes = gguf_test::sample_file();
  gguf_test::patch_u32(bytes, 4, 2);
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "v2.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->version(), 2u);
  EXPECT_EQ((*file)->keys(), kExpectedKeys);
  expect_tensors(**file, bytes.data());
}

TEST(GgufReaderRoundTrip, EmptyFileWithNoTensorsIsValid) {
  const std::vector<uint8_t> bytes = GgufWriter().serialize();
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "empty.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_TRUE((*file)->keys().empty());
  EXPECT_TRUE((*file)->tensors().empty());
}

// The writer must lay data out with the alignment the file declares, or the reader (which
// honours general.alignment) finds misaligned offsets or reads the wrong bytes.
TEST(GgufReaderRoundTrip, DeclaredAlignmentIsHonouredByWriterAndReader) {
  for (uint32_t alignment : {8u, 64u, 256u}) {
    SCOPED_TRACE(alignment);
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_uint32("general.alignment", alignment);
    const auto a = gguf_test::quantized(TensorType::kF32, gguf_test::sample_floats(5, 1.0f));
    const auto b = gguf_test::quantized(TensorType::kF16, gguf_test::sample_floats(7, 2.0f));
    ASSERT_TRUE(w.add_tensor("a", TensorType::kF32, {5}, a).ok());
    ASSERT_TRUE(w.add_tensor("b", TensorType::kF16, {7}, b).ok());
    const std::vector<uint8_t> bytes = w.serialize();
    auto file = GgufFile::parse(bytes.data(), bytes.size(), "aligned.gguf");
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_EQ((*file)->alignment(), alignment);
    const auto& ts = (*file)->tensors();
    ASSERT_EQ(ts.size(), 2u);
    EXPECT_EQ(static_cast<uint64_t>(ts[0].data - bytes.data()) % alignment, 0u);
    EXPECT_EQ(ts[1].offset_bytes % alignment, 0u);
    EXPECT_EQ(std::vector<uint8_t>(ts[0].data, ts[0].data + ts[0].n_bytes), a);
    EXPECT_EQ(std::vector<uint8_t>(ts[1].data, ts[1].data + ts[1].n_bytes), b);
  }
}

TEST(GgufReaderOpen, MissingPathIsNotFound) {
  auto file = GgufFile::open(testing::temp_dir() + "/does_not_exist.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("does_not_exist.gguf"), std::string::npos);
}

TEST(GgufReaderOpen, DirectoryIsInvalidArgument) {
  auto file = GgufFile::open(testing::temp_dir());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
}

TEST(GgufReaderOpen, EmptyFileIsDataLoss) {
  const std::string path = testing::temp_dir() + "/empty.gguf";
  std::ofstream(path, std::ios::binary).close();
  auto file = GgufFile::open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("magic"), std::string::npos);
}

class GgufReaderGetters : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = gguf_test::sample_file();
    auto file = GgufFile::parse(bytes_.data(), bytes_.size(), "sample.gguf");
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    file_ = std::move(*file);
  }
  // A failed getter must name the key; `code` is the expected StatusCode.
  static void expect_error(const Status& s, StatusCode code, const std::string& key) {
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find("'" + key + "'"), std::string::npos) << s.message();
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufReaderGetters, GetString) {
  EXPECT_EQ(file_->get_string("general.architecture").value(), "llama");
  EXPECT_EQ(file_->get_string("test.empty_string").value(), "");
  expect_error(file_->get_string("general.missing").status(), StatusCode::kNotFound, "general.missing");
  expect_error(file_->get_string("test.u32").status(), StatusCode::kInvalidArgument, "test.u32");
  expect_error(file_->get_string("tokenizer.ggml.tokens").status(), StatusCode::kInvalidArgument,
               "tokenizer.ggml.tokens");
}

TEST_F(GgufReaderGetters, GetUintAcceptsEveryNonNegativeInteger) {
  EXPECT_EQ(file_->get_uint("test.u32").value(), 4000000000u);
  EXPECT_EQ(file_->get_uint("test.i32_pos").value(), 7u);
  EXPECT_EQ(file_->get_uint("test.u8").value(), 200u);
  EXPECT_EQ(file_->get_uint("test.u16").value(), 65000u);
  auto big = file_->get_uint("test.u64");  // above INT64_MAX, still a valid unsigned value
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_EQ(*big, kBigU64);
}

TEST_F(GgufReaderGetters, GetUintRefusesNegativesFloatsAndStrings) {
  expect_error(file_->get_uint("test.i32").status(), StatusCode::kInvalidArgument, "test.i32");
  expect_error(file_->get_uint("test.i64").status(), StatusCode::kInvalidArgument, "test.i64");
  expect_error(file_->get_uint("test.f32").status(), StatusCode::kInvalidArgument, "test.f32");
  expect_error(file_->get_uint("general.name").status(), StatusCode::kInvalidArgument, "general.name");
  expect_error(file_->get_uint("test.int_array").status(), StatusCode::kInvalidArgument, "test.int_array");
  expect_error(file_->get_uint("nope").status(), StatusCode::kNotFound, "nope");
}

TEST_F(GgufReaderGetters, GetFloatConvertsNumbers) {
  EXPECT_EQ(file_->get_float("test.f32").value(), 0.15625);
  EXPECT_EQ(file_->get_float("test.f64").value(), 1.0 / 3.0);
  EXPECT_EQ(file_->get_float("test.u32").value(), 4e9);
  EXPECT_EQ(file_->get_float("test.i32").value(), -123456.0);
  EXPECT_EQ(file_->get_float("test.u64").value(), static_cast<double>(kBigU64));
  expect_error(file_->get_float("general.name").status(), StatusCode::kInvalidArgument, "general.name");
  expect_error(file_->get_float("test.float_array").status(), StatusCode::kInvalidArgument,
               "test.float_array");
  expect_error(file_->get_float("nope").status(), StatusCode::kNotFound, "nope");
}

TEST_F(GgufReaderGetters, GetBool) {
  EXPECT_TRUE(file_->get_bool("test.bool_true").value());
  EXPECT_FALSE(file_->get_bool("test.bool_false").value());
  expect_error(file_->get_bool("test.u8").status(), StatusCode::kInvalidArgument, "test.u8");
  expect_error(file_->get_bool("nope").status(), StatusCode::kNotFound, "nope");
}

TEST_F(GgufReaderGetters, ArrayGettersMatchElementKind) {
  ASSERT_NE(file_->get_string_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(*file_->get_string_array("tokenizer.ggml.tokens"), expected_tokens());
  ASSERT_NE(file_->get_int_array("test.int_array"), nullptr);
  EXPECT_EQ(file_->get_int_array("test.int_array")->size(), 5u);
  ASSERT_NE(file_->get_int_array("test.bool_array"), nullptr);
  ASSERT_NE(file_->get_float_array("test.float_array"), nullptr);
  EXPECT_EQ(file_->get_float_array("test.float_array")->at(1), -2.25);
  EXPECT_EQ(file_->get_string_array("test.int_array"), nullptr);
  EXPECT_EQ(file_->get_int_array("test.float_array"), nullptr);
  EXPECT_EQ(file_->get_int_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(file_->get_int_array("test.nested"), nullptr);
  EXPECT_EQ(file_->get_float_array("test.int_array"), nullptr);
  EXPECT_EQ(file_->get_float_array("test.f32"), nullptr);
  EXPECT_EQ(file_->get_string_array("general.name"), nullptr);
  EXPECT_EQ(file_->get_string_array("nope"), nullptr);
}

TEST_F(GgufReaderGetters, DisplayStrings) {
  EXPECT_EQ(file_->find("test.bool_true")->to_display_string(), "true");
  EXPECT_EQ(file_->find("test.i32")->to_display_string(), "-123456");
  EXPECT_EQ(file_->find("test.u64")->to_display_string(), std::to_string(kBigU64));
  const std::string tokens = file_->find("tokenizer.ggml.tokens")->to_display_string(3);
  EXPECT_NE(tokens.find("'hello'"), std::string::npos) << tokens;
  EXPECT_EQ(tokens.find("tok_0"), std::string::npos) << tokens;  // only 3 items shown
}

TEST(GgufWriter, RejectsInconsistentTensors) {
  GgufWriter w;
  EXPECT_EQ(w.add_tensor("short", TensorType::kF32, {4}, std::vector<uint8_t>(15)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("no_dims", TensorType::kF32, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("five", TensorType::kF32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("zero", TensorType::kF32, {4, 0}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("row", TensorType::kQ8_0, {33}, std::vector<uint8_t>(34)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.add_tensor("ok", TensorType::kF32, {1}, std::vector<uint8_t>(4)).ok());
  EXPECT_EQ(w.add_tensor("ok", TensorType::kF32, {1}, std::vector<uint8_t>(4)).code(),
            StatusCode::kInvalidArgument);
  // Only the accepted tensor is written.
  const auto bytes = w.serialize();
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "w.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ((*file)->tensors().size(), 1u);
  EXPECT_EQ((*file)->tensors()[0].name, "ok");
}

TEST(GgufWriter, SettingAKeyTwiceKeepsOneEntryWithTheLastValue) {
  GgufWriter w;
  w.set_uint32("k", 1);
  w.set_string("k", "two");
  const auto bytes = w.serialize();
  auto file = GgufFile::parse(bytes.data(), bytes.size(), "w.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->keys(), std::vector<std::string>{"k"});
  EXPECT_EQ((*file)->get_string("k").value(), "two");
}

}  // namespace
}  // namespace helios
