// Helpers shared by the GGUF tests: a byte assembler for hand-made files (so every field's
// offset is known), the sample file the round-trip and sweep tests use, and a parse that
// copies its input into an exact-size heap block so that ASan/valgrind catch any over-read.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "helios/gguf.h"
#include "helios/tensor_type.h"

namespace helios::gguf_test {

// Little-endian GGUF bytes assembled field by field; size() before a put is that field's offset.
class RawGguf {
 public:
  template <typename T>
  RawGguf& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  RawGguf& raw(const std::string& s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& str(const std::string& s) { return put<uint64_t>(s.size()).raw(s); }
  RawGguf& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return raw("GGUF").put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  // key, type id, then the caller puts the value.
  RawGguf& key(const std::string& k, GgufType type) {
    return str(k).put<uint32_t>(static_cast<uint32_t>(type));
  }
  RawGguf& kv_u32(const std::string& k, uint32_t v) { return key(k, GgufType::kUint32).put(v); }
  RawGguf& kv_string(const std::string& k, const std::string& v) {
    return key(k, GgufType::kString).str(v);
  }
  RawGguf& tensor_info(const std::string& name, const std::vector<uint64_t>& dims,
                       uint32_t type_id, uint64_t offset_bytes) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(d);
    return put<uint32_t>(type_id).put<uint64_t>(offset_bytes);
  }
  RawGguf& pad_to(size_t alignment) {
    while (bytes_.size() % alignment) bytes_.push_back(0);
    return *this;
  }
  RawGguf& fill(size_t n, uint8_t value) {
    bytes_.insert(bytes_.end(), n, value);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

inline void patch_u32(std::vector<uint8_t>& bytes, size_t at, uint32_t v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

// Parses the first `n` bytes from a heap block of exactly `n` bytes. On success every tensor's
// first and last data byte is read, so a data pointer outside the image is caught too.
inline Status parse_exact(const std::vector<uint8_t>& bytes, size_t n) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n == 0 ? 1 : n]);  // new[0] may not trap reads
  if (n) std::memcpy(copy.get(), bytes.data(), n);
  const uint8_t* base = n ? copy.get() : nullptr;
  auto file = GgufFile::parse(base, n, "mem.gguf");
  if (!file.ok()) return file.status();
  volatile uint32_t sink = 0;
  for (const auto& t : (*file)->tensors()) {
    if (t.n_bytes) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
  }
  return ok_status();
}

// Sample tensors: F32 [8, 2], F16 [16], Q8_0 [64, 3] (204 bytes, so 20 bytes of tail padding).
inline std::vector<float> sample_floats(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 23 - 11);
  return v;
}

inline std::vector<uint8_t> quantized(TensorType type, const std::vector<float>& x) {
  std::vector<uint8_t> out(tensor_row_bytes(type, static_cast<int64_t>(x.size())));
  Status s = quantize_row(type, x.data(), out.data(), static_cast<int64_t>(x.size()));
  if (!s.ok()) out.clear();  // add_tensor then rejects the size
  return out;
}

inline GgufValue int_array(GgufType elem, std::vector<int64_t> xs) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = elem;
  v.ints = std::move(xs);
  return v;
}

inline GgufValue scalar(GgufType type, int64_t i, double f = 0) {
  GgufValue v;
  v.type = type;
  v.i64 = i;
  v.u64 = static_cast<uint64_t>(i);
  v.f64 = f;
  return v;
}

inline constexpr uint64_t kBigU64 = (uint64_t{1} << 63) + 5;
inline constexpr int kNumFillerTokens = 60;

// Every metadata type, arrays of strings/ints/floats, nested arrays, and three tensors.
inline GgufWriter sample_writer() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "tiny \xc3\xbc \xe2\x9c\x93");
  w.set_string("test.empty_string", "");
  w.set_uint32("test.u32", 4000000000u);
  w.set_int32("test.i32", -123456);
  w.set_int32("test.i32_pos", 7);
  w.set_uint64("test.u64", kBigU64);
  w.set_float32("test.f32", 0.15625f);
  w.set_bool("test.bool_true", true);
  w.set_bool("test.bool_false", false);
  w.set_value("test.u8", scalar(GgufType::kUint8, 200));
  w.set_value("test.i8", scalar(GgufType::kInt8, -100));
  w.set_value("test.u16", scalar(GgufType::kUint16, 65000));
  w.set_value("test.i16", scalar(GgufType::kInt16, -30000));
  w.set_value("test.i64", scalar(GgufType::kInt64, -(int64_t{1} << 40)));
  w.set_value("test.f64", scalar(GgufType::kFloat64, 0, 1.0 / 3.0));
  std::vector<std::string> tokens = {"<s>", "", "hello", " world", "\xc3\xbc"};
  for (int i = 0; i < kNumFillerTokens; ++i) tokens.push_back("tok_" + std::to_string(i));
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_int32_array("test.int_array", {-1, 0, 1, 2147483647, -2147483647 - 1});
  w.set_float32_array("test.float_array", {0.5f, -2.25f, 1e-30f, 3.4e38f});
  w.set_int32_array("test.empty_array", {});
  w.set_value("test.bool_array", int_array(GgufType::kBool, {1, 0, 1}));
  GgufValue nested;  // [[1, 2], [], ["a", "bc"]]
  nested.type = GgufType::kArray;
  nested.array_type = GgufType::kArray;
  nested.arrays.push_back(int_array(GgufType::kUint16, {1, 2}));
  nested.arrays.push_back(int_array(GgufType::kInt8, {}));
  GgufValue strs;
  strs.type = GgufType::kArray;
  strs.array_type = GgufType::kString;
  strs.strings = {"a", "bc"};
  nested.arrays.push_back(strs);
  w.set_value("test.nested", nested);

  Status s1 = w.add_tensor("f32.weight", TensorType::kF32, {8, 2},
                           quantized(TensorType::kF32, sample_floats(16, 0.25f)));
  Status s2 = w.add_tensor("f16.weight", TensorType::kF16, {16},
                           quantized(TensorType::kF16, sample_floats(16, 0.5f)));
  Status s3 = w.add_tensor("q8_0.weight", TensorType::kQ8_0, {64, 3},
                           quantized(TensorType::kQ8_0, sample_floats(192, 0.1f)));
  if (!s1.ok() || !s2.ok() || !s3.ok()) return GgufWriter();  // tests then fail on contents
  return w;
}

inline std::vector<uint8_t> sample_file() { return sample_writer().serialize(); }

}  // namespace helios::gguf_test
