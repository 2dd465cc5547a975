// Malformed GGUF files: every one must be refused with DATA_LOSS and a message that names the
// field and its byte offset, never a crash, an over-read or a huge allocation. Inputs are built
// in code (no binaries in the repository); parse_exact() copies each into an exact-size heap
// block so that an ASan or valgrind run catches any read past the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>

#include "gguf_test_util.h"
#include "helios/gguf.h"

namespace helios {
namespace {

using gguf_test::parse_exact;
using gguf_test::RawGguf;

constexpr uint64_t kHeaderBytes = 24;  // magic, version, n_tensors, n_kv
constexpr uint32_t kF32 = 0, kQ8_0 = 8;

struct Malformed {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string field;   // the message must name this field...
  std::string detail;  // ...and say this about it
  int64_t offset;      // the byte offset it must report, or -1 where the reader gives none
};

// gtest prints a failing parameter with this instead of its raw bytes.
void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

std::string at_offset(uint64_t off) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "at offset 0x%llx:", static_cast<unsigned long long>(off));
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Header

std::vector<Malformed> header_cases() {
  std::vector<Malformed> out;
  out.push_back({"EmptyFile", {}, "magic", "file ends after 0 bytes", 0});
  RawGguf magic;
  magic.raw("GGUX").put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
  out.push_back({"BadMagic", magic.bytes(), "magic", "expected \"GGUF\"", 0});
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    RawGguf r;
    r.header(v, 0, 0);
    out.push_back({"Version" + std::to_string(v), r.bytes(), "version",
                   "GGUF version " + std::to_string(v) + " is not supported", 4});
  }
  RawGguf short_version;
  short_version.raw("GGUF").put<uint16_t>(3);
  out.push_back({"TruncatedVersion", short_version.bytes(), "version", "file ends after 6 bytes", 4});
  RawGguf huge_kv;
  huge_kv.header(3, 0, uint64_t{1} << 60).fill(64, 0);
  out.push_back({"HugeMetadataCount", huge_kv.bytes(), "metadata count", "count 1152921504606846976", 16});
  RawGguf huge_tensors;
  huge_tensors.header(3, uint64_t{1} << 60, 0).fill(64, 0);
  out.push_back({"HugeTensorCount", huge_tensors.bytes(), "tensor count", "count 1152921504606846976", 8});
  RawGguf max_kv;
  max_kv.header(3, 0, ~uint64_t{0});
  out.push_back({"MaxMetadataCount", max_kv.bytes(), "metadata count", "needs at least 13 bytes", 16});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Metadata keys and values

std::vector<Malformed> key_cases() {
  std::vector<Malformed> out;
  for (uint64_t len : {uint64_t{100}, uint64_t{1} << 63, ~uint64_t{0}}) {
    RawGguf r;
    r.header(3, 0, 1).put<uint64_t>(len).raw("abcdefgh");
    out.push_back({"KeyLength" + std::to_string(len), r.bytes(), "metadata[0] key",
                   "string length " + std::to_string(len) + " exceeds the 8 bytes left", kHeaderBytes});
  }
  RawGguf dup;
  dup.header(3, 0, 2).kv_u32("k", 1);
  const uint64_t second = dup.size();
  dup.kv_u32("k", 2);
  out.push_back({"DuplicateKey", dup.bytes(), "'k'", "duplicate metadata key", static_cast<int64_t>(second)});
  return out;
}

std::vector<Malformed> value_cases() {
  std::vector<Malformed> out;
  for (uint32_t type : {13u, 0xFFFFFFFFu}) {
    RawGguf r;
    r.header(3, 0, 1).str("k");
    const uint64_t at = r.size();
    r.put<uint32_t>(type).put<uint32_t>(0);
    out.push_back({"ValueType" + std::to_string(type), r.bytes(), "type of 'k'",
                   "unknown value type id " + std::to_string(type), static_cast<int64_t>(at)});
  }
  RawGguf str;
  str.header(3, 0, 1).key("k", GgufType::kString);
  const uint64_t str_at = str.size();
  str.put<uint64_t>(uint64_t{1} << 63).raw("xyz");
  out.push_back({"StringValueLength2Pow63", str.bytes(), "'k'", "string length 9223372036854775808",
                 static_cast<int64_t>(str_at)});
  RawGguf b;
  b.header(3, 0, 1).key("k", GgufType::kBool);
  const uint64_t bool_at = b.size();
  b.put<uint8_t>(2);
  out.push_back({"BoolValue2", b.bytes(), "'k'", "bool value 2 is neither 0 nor 1", static_cast<int64_t>(bool_at)});
  RawGguf u64;
  u64.header(3, 0, 1).key("k", GgufType::kUint64);
  const uint64_t u64_at = u64.size();
  u64.put<uint32_t>(7);  // half of the value
  out.push_back({"TruncatedU64Value", u64.bytes(), "'k'", "file ends after", static_cast<int64_t>(u64_at)});
  return out;
}

std::vector<Malformed> array_cases() {
  std::vector<Malformed> out;
  RawGguf elem;
  elem.header(3, 0, 1).key("k", GgufType::kArray);
  const uint64_t elem_at = elem.size();
  elem.put<uint32_t>(13).put<uint64_t>(0);
  out.push_back({"ArrayElementType13", elem.bytes(), "'k'", "unknown array element type id 13",
                 static_cast<int64_t>(elem_at)});
  const std::pair<GgufType, const char*> huge_counts[] = {
      {GgufType::kUint32, "U32"}, {GgufType::kString, "String"}, {GgufType::kArray, "Array"},
      {GgufType::kUint8, "U8"}};
  for (const auto& [type, name] : huge_counts) {
    RawGguf r;
    r.header(3, 0, 1).key("k", GgufType::kArray).put<uint32_t>(static_cast<uint32_t>(type));
    const uint64_t at = r.size();
    r.put<uint64_t>(uint64_t{1} << 62).fill(32, 0);
    out.push_back({std::string("HugeArrayCount") + name, r.bytes(), "'k' array length",
                   "count 4611686018427387904", static_cast<int64_t>(at)});
  }
  RawGguf one_over;  // three u32 elements announced, two present
  one_over.header(3, 0, 1).key("k", GgufType::kArray).put<uint32_t>(4);
  const uint64_t over_at = one_over.size();
  one_over.put<uint64_t>(3).put<uint32_t>(1).put<uint32_t>(2);
  out.push_back({"ArrayCountOneTooMany", one_over.bytes(), "'k' array length", "count 3",
                 static_cast<int64_t>(over_at)});
  RawGguf bools;
  bools.header(3, 0, 1).key("k", GgufType::kArray).put<uint32_t>(7).put<uint64_t>(2).put<uint8_t>(1);
  const uint64_t bool_at = bools.size();
  bools.put<uint8_t>(2);
  out.push_back({"BoolArrayElement2", bools.bytes(), "'k'[1]", "bool value 2", static_cast<int64_t>(bool_at)});
  RawGguf deep;  // five levels: the reader allows four
  deep.header(3, 0, 1).key("k", GgufType::kArray);
  for (int level = 0; level < 4; ++level) deep.put<uint32_t>(9).put<uint64_t>(1);
  const uint64_t deep_at = deep.size();
  deep.put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(7);
  out.push_back({"ArraysNestedFiveDeep", deep.bytes(), "'k'[0][0][0][0]", "nested deeper than 4 levels",
                 static_cast<int64_t>(deep_at)});
  return out;
}

// ---------------------------------------------------------------------------------------------
// general.alignment

std::vector<Malformed> alignment_cases() {
  std::vector<Malformed> out;
  for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
    RawGguf r;
    r.header(3, 0, 1).kv_u32("general.alignment", a);
    out.push_back({"Alignment" + std::to_string(a), r.bytes(), "general.alignment",
                   "must be a power of two", -1});
  }
  RawGguf s;
  s.header(3, 0, 1).kv_string("general.alignment", "32");
  out.push_back({"AlignmentString", s.bytes(), "general.alignment", "must be a power of two", -1});
  RawGguf neg;
  neg.header(3, 0, 1).key("general.alignment", GgufType::kInt32).put<int32_t>(-32);
  out.push_back({"AlignmentNegative", neg.bytes(), "general.alignment", "must be a power of two", -1});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tensor infos

// One tensor named "t"; n_dims sits at 33, dims from 37. `tail` zero bytes follow the info.
Malformed tensor_case(const std::string& name, uint32_t n_dims, const std::vector<uint64_t>& dims,
                      uint32_t type, const std::string& detail, int64_t offset) {
  RawGguf r;
  r.header(3, 1, 0).str("t").put<uint32_t>(n_dims);
  for (uint64_t d : dims) r.put<uint64_t>(d);
  r.put<uint32_t>(type).put<uint64_t>(0).pad_to(32).fill(256, 0);
  return {name, r.bytes(), "tensor 't'", detail, offset};
}

std::vector<Malformed> tensor_info_cases() {
  constexpr int64_t kNDims = 33, kDim0 = 37;
  std::vector<Malformed> out;
  out.push_back(tensor_case("NDims0", 0, {}, kF32, "n_dims = 0 (must be 1..4)", kNDims));
  out.push_back(tensor_case("NDims5", 5, {1, 1, 1, 1, 1}, kF32, "n_dims = 5 (must be 1..4)", kNDims));
  out.push_back(tensor_case("NDimsHuge", 0xFFFFFFFF, {1}, kF32, "n_dims = 4294967295", kNDims));
  out.push_back(tensor_case("Dim0IsZero", 2, {0, 4}, kF32, "dimension 0 = 0", kDim0));
  out.push_back(tensor_case("Dim1IsZero", 2, {4, 0}, kF32, "dimension 1 = 0", kDim0 + 8));
  out.push_back(tensor_case("DimTooLarge", 1, {(uint64_t{1} << 40) + 1}, kF32,
                            "dimension 0 = 1099511627777", kDim0));
  out.push_back(tensor_case("DimsProductOverflows", 3, {1u << 30, 1u << 30, 1u << 30}, kF32,
                            "dimension 1 = 1073741824", kDim0 + 8));
  out.push_back(tensor_case("DimsProductOverflows64", 4, {1u << 20, 1u << 20, 1u << 20, 1u << 20},
                            kF32, "dimension 2 = 1048576", kDim0 + 16));
  for (uint32_t type : {4u, 31u, 0xFFFFFFFFu}) {
    out.push_back(tensor_case("TensorType" + std::to_string(type), 1, {32}, type,
                              "unknown tensor type id " + std::to_string(type), kDim0 + 8));
  }
  out.push_back(tensor_case("RowNotMultipleOfBlock", 2, {33, 2}, kQ8_0,
                            "row length 33 is not a multiple of the Q8_0 block size 32", kDim0 + 16));
  RawGguf name;
  name.header(3, 1, 0).put<uint64_t>(uint64_t{1} << 63).fill(64, 0);
  out.push_back({"TensorNameLength2Pow63", name.bytes(), "tensor[0] name", "string length", kHeaderBytes});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tensor offsets and data

std::vector<Malformed> tensor_data_cases() {
  constexpr int64_t kOffsetField = 49;  // 24 + name 9 + n_dims 4 + dim 8 + type 4
  std::vector<Malformed> out;
  RawGguf unaligned;
  unaligned.header(3, 1, 0).tensor_info("t", {8}, kF32, 8).pad_to(32).fill(64, 0);
  out.push_back({"OffsetNotAligned", unaligned.bytes(), "tensor 't'",
                 "data offset 8 is not a multiple of the alignment 32", kOffsetField});
  RawGguf custom;  // 32 is fine by default but not under a declared alignment of 64
  custom.header(3, 1, 1).kv_u32("general.alignment", 64);
  const uint64_t custom_at = custom.size() + 9 + 4 + 8 + 4;
  custom.tensor_info("t", {8}, kF32, 32).pad_to(64).fill(128, 0);
  out.push_back({"OffsetNotAlignedTo64", custom.bytes(), "tensor 't'",
                 "not a multiple of the alignment 64", static_cast<int64_t>(custom_at)});
  // Data section starts at 64 (the 57-byte header padded to 32).
  RawGguf past;
  past.header(3, 1, 0).tensor_info("t", {8}, kF32, 32).pad_to(32).fill(40, 0);
  out.push_back({"DataPastEnd", past.bytes(), "tensor 't'",
                 "data [0x60, +32 bytes) runs past the end of the file (104 bytes", -1});
  RawGguf short_by_one;
  short_by_one.header(3, 1, 0).tensor_info("t", {8}, kF32, 0).pad_to(32).fill(31, 0);
  out.push_back({"DataShortByOneByte", short_by_one.bytes(), "tensor 't'",
                 "data [0x40, +32 bytes) runs past the end", -1});
  for (uint64_t off : {uint64_t{1} << 63, ~uint64_t{31}}) {
    RawGguf huge;
    huge.header(3, 1, 0).tensor_info("t", {8}, kF32, off).pad_to(32).fill(64, 0);
    out.push_back({"DataOffset" + std::to_string(off), huge.bytes(), "tensor 't'", "runs past the end", -1});
  }
  RawGguf no_data;  // the tensor infos end at 57; the data section would start at 64
  no_data.header(3, 1, 0).tensor_info("t", {8}, kF32, 0);
  out.push_back({"DataStartPastEnd", no_data.bytes(), "tensor data",
                 "at offset 0x40 starts past the end of the file (57 bytes)", -1});
  RawGguf dup;
  dup.header(3, 2, 0).tensor_info("t", {8}, kF32, 0);
  const uint64_t dup_at = dup.size();
  dup.tensor_info("t", {8}, kF32, 32).pad_to(32).fill(64, 0);
  out.push_back({"DuplicateTensorName", dup.bytes(), "tensor 't'", "duplicate tensor name",
                 static_cast<int64_t>(dup_at)});
  return out;
}

std::vector<Malformed> all_cases() {
  std::vector<Malformed> all;
  for (auto make : {header_cases, key_cases, value_cases, array_cases, alignment_cases,
                    tensor_info_cases, tensor_data_cases}) {
    for (auto& c : make()) all.push_back(std::move(c));
  }
  return all;
}

class GgufMalformedCorpus : public ::testing::TestWithParam<Malformed> {};

TEST_P(GgufMalformedCorpus, IsRefusedWithFieldAndOffset) {
  const Malformed& c = GetParam();
  const Status s = parse_exact(c.bytes, c.bytes.size());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  const std::string& m = s.message();
  EXPECT_EQ(m.rfind("mem.gguf: ", 0), 0u) << m;
  EXPECT_NE(m.find(c.field), std::string::npos) << "field '" << c.field << "' not in: " << m;
  EXPECT_NE(m.find(c.detail), std::string::npos) << "'" << c.detail << "' not in: " << m;
  if (c.offset >= 0) {
    EXPECT_NE(m.find(at_offset(static_cast<uint64_t>(c.offset))), std::string::npos)
        << "expected " << at_offset(static_cast<uint64_t>(c.offset)) << " in: " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(GgufMalformed, GgufMalformedCorpus, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Malformed>& info) { return info.param.name; });

// The corpus above only proves something if the same builders make files the reader accepts.
TEST(GgufMalformedControls, HandBuiltValidFilesParse) {
  RawGguf tensor;
  tensor.header(3, 1, 0).tensor_info("t", {8}, kF32, 0).pad_to(32).fill(32, 0);
  EXPECT_TRUE(parse_exact(tensor.bytes(), tensor.size()).ok());
  RawGguf aligned;
  aligned.header(3, 1, 1).kv_u32("general.alignment", 64).tensor_info("t", {8}, kF32, 64);
  aligned.pad_to(64).fill(96, 0);
  EXPECT_TRUE(parse_exact(aligned.bytes(), aligned.size()).ok());
  RawGguf four_deep;
  four_deep.header(3, 0, 1).key("k", GgufType::kArray);
  for (int level = 0; level < 3; ++level) four_deep.put<uint32_t>(9).put<uint64_t>(1);
  four_deep.put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(7);
  auto file = GgufFile::parse(four_deep.bytes().data(), four_deep.size(), "deep.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->find("k")->arrays.at(0).arrays.at(0).arrays.at(0).ints,
            std::vector<int64_t>{7});
  RawGguf exact_count;
  exact_count.header(3, 0, 1).key("k", GgufType::kArray).put<uint32_t>(4).put<uint64_t>(2);
  exact_count.put<uint32_t>(1).put<uint32_t>(2);
  EXPECT_TRUE(parse_exact(exact_count.bytes(), exact_count.size()).ok());
  RawGguf big_dims;  // 2^50 elements is the largest tensor the reader describes
  big_dims.header(3, 1, 0).tensor_info("t", {uint64_t{1} << 25, uint64_t{1} << 25}, kF32, 0);
  big_dims.pad_to(32).fill(32, 0);
  EXPECT_NE(parse_exact(big_dims.bytes(), big_dims.size()).message().find("runs past the end"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Sweeps over a valid writer-made file

struct SampleLayout {
  std::vector<uint8_t> bytes;
  uint64_t data_start = 0;      // first byte of the data section
  uint64_t required_bytes = 0;  // end of the last tensor's data (the rest is padding)
};

SampleLayout sample_layout() {
  SampleLayout s;
  s.bytes = gguf_test::sample_file();
  auto file = GgufFile::parse(s.bytes.data(), s.bytes.size(), "sample.gguf");
  if (!file.ok()) return s;
  for (const auto& t : (*file)->tensors()) {
    const uint64_t start = static_cast<uint64_t>(t.data - s.bytes.data()) - t.offset_bytes;
    s.data_start = start;
    s.required_bytes = std::max(s.required_bytes, start + t.offset_bytes + t.n_bytes);
  }
  return s;
}

TEST(GgufMalformedSweep, EveryTruncationFailsCleanly) {
  const SampleLayout s = sample_layout();
  ASSERT_GT(s.required_bytes, 1500u) << "the sample file should be about 2 KB";
  ASSERT_LT(s.required_bytes, s.bytes.size()) << "the last tensor should be followed by padding";
  for (size_t n = 0; n < s.bytes.size(); ++n) {
    const Status st = parse_exact(s.bytes, n);
    if (n >= s.required_bytes) {  // only tail padding is missing: still a complete file
      EXPECT_TRUE(st.ok()) << "prefix " << n << ": " << st.to_string();
      continue;
    }
    ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    const bool located = st.message().find("offset") != std::string::npos ||
                         st.message().find("past the end of the file") != std::string::npos;
    EXPECT_TRUE(located) << "prefix " << n << ": " << st.message();
  }
}

// A mutation: overwrite 1–4 bytes with a flipped bit, a random byte, or an extreme integer.
void mutate(std::vector<uint8_t>& b, uint64_t header_bytes, std::mt19937_64& rng) {
  const uint64_t extremes[] = {0, 1, 2, 5, 9, 13, 31, 0xFF, 0xFFFFFFFF, uint64_t{1} << 63, ~uint64_t{0}};
  const int n_edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < n_edits; ++e) {
    // Mostly the header, where the structure is; sometimes the data section.
    const uint64_t limit = rng() % 10 < 9 ? header_bytes : b.size();
    const uint64_t at = rng() % limit;
    switch (rng() % 3) {
      case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 1: b[at] = static_cast<uint8_t>(rng()); break;
      default: {
        const uint64_t v = extremes[rng() % std::size(extremes)];
        const size_t width = std::min<size_t>(rng() % 2 ? 8 : 4, b.size() - at);
        std::memcpy(b.data() + at, &v, width);
      }
    }
  }
}

// Touches what a caller would use, so a bad value that parsed still cannot crash its users.
void exercise(const GgufFile& f) {
  for (const auto& key : f.keys()) {
    ASSERT_NE(f.find(key), nullptr);
    (void)f.find(key)->to_display_string();
    (void)f.get_uint(key);
    (void)f.get_float(key);
  }
  for (const auto& t : f.tensors()) EXPECT_GT(t.n_rows(), 0);
}

TEST(GgufMalformedSweep, RandomByteMutationsNeverCrash) {
  const SampleLayout s = sample_layout();
  ASSERT_GT(s.data_start, 0u);
  std::mt19937_64 rng(20240607);
  int n_ok = 0, n_refused = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = s.bytes;
    mutate(b, s.data_start, rng);
    std::unique_ptr<uint8_t[]> copy(new uint8_t[b.size()]);
    std::memcpy(copy.get(), b.data(), b.size());
    auto file = GgufFile::parse(copy.get(), b.size(), "mem.gguf");
    if (file.ok()) {
      ++n_ok;
      exercise(**file);
      continue;
    }
    ++n_refused;
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << file.status().to_string();
    EXPECT_FALSE(file.status().message().empty());
  }
  // Both outcomes must occur, or the sweep is not testing what it claims.
  EXPECT_GT(n_refused, 200);
  EXPECT_GT(n_ok, 50);
}

}  // namespace
}  // namespace helios
