// GGUF model files: a bounds-checked reader over mmap and a writer.
//
// The reader trusts nothing in the file: every count, length, offset and dimension is checked
// against the file size before it is used, and a failure names the field and its byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "helios/status.h"
#include "helios/tensor_type.h"

namespace helios {

// Metadata value types, with the ids the GGUF format gives them.
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* gguf_type_name(GgufType type);

// One metadata value. Scalars live in one of `u64`/`i64`/`f64`; arrays keep their elements by
// kind so that a 49152-entry vocabulary costs one vector, not 49152 values.
struct GgufValue {
  GgufType type = GgufType::kUint32;
  GgufType array_type = GgufType::kUint32;  // element type when type == kArray
  uint64_t u64 = 0;                         // unsigned ints and bool
  int64_t i64 = 0;                          // signed ints
  double f64 = 0;                           // floats
  std::string str;                          // kString
  std::vector<std::string> strings;         // array of strings
  std::vector<int64_t> ints;                // array of any integer type or bool
  std::vector<double> floats;               // array of float32/float64
  std::vector<GgufValue> arrays;            // array of arrays

  bool is_integer() const;
  bool is_float() const;
  size_t array_size() const;
  std::string to_display_string(size_t max_items = 8) const;  // for `helios inspect`
};

struct GgufTensorInfo {
  std::string name;
  TensorType type = TensorType::kF32;
  std::vector<int64_t> dims;     // GGML order: dims[0] is the contiguous (row) length
  uint64_t offset_bytes = 0;     // from the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr; // into the mapping; valid while the GgufFile lives

  int64_t n_elements() const;
  int64_t n_rows() const { return n_elements() / dims[0]; }
};

// A read-only, memory-mapped GGUF file.
class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses an in-memory image (the caller keeps it alive); used by tests and fuzzing.
  static StatusOr<std::unique_ptr<GgufFile>> parse(const uint8_t* bytes, size_t size,
                                                   const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  const std::vector<std::string>& keys() const { return key_order_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;

  // Typed getters: NOT_FOUND when absent, INVALID_ARGUMENT naming the key on a type mismatch.
  StatusOr<std::string> get_string(const std::string& key) const;
  StatusOr<uint64_t> get_uint(const std::string& key) const;  // any non-negative integer type
  StatusOr<double> get_float(const std::string& key) const;   // float or integer types
  StatusOr<bool> get_bool(const std::string& key) const;
  const std::vector<std::string>* get_string_array(const std::string& key) const;
  const std::vector<int64_t>* get_int_array(const std::string& key) const;
  const std::vector<double>* get_float_array(const std::string& key) const;

 private:
  GgufFile() = default;
  Status parse_all();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when we own an mmap
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF v3 file in memory and writes it out. Tensors are given as raw bytes already in
// their type's layout (see quantize_row in tensor_type.h).
class GgufWriter {
 public:
  void set_uint32(const std::string& key, uint32_t v);
  void set_int32(const std::string& key, int32_t v);
  void set_uint64(const std::string& key, uint64_t v);
  void set_float32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_float32_array(const std::string& key, const std::vector<float>& v);
  void set_int32_array(const std::string& key, const std::vector<int32_t>& v);
  // Any value read from another file (used to copy metadata).
  void set_value(const std::string& key, const GgufValue& v);

  Status add_tensor(const std::string& name, TensorType type, const std::vector<int64_t>& dims,
                    std::vector<uint8_t> bytes);
  // A tensor whose bytes are made only when the file is written, so that a model larger than
  // memory can be written one tensor at a time.
  using TensorMaker = std::function<std::vector<uint8_t>()>;
  Status add_tensor_lazy(const std::string& name, TensorType type,
                         const std::vector<int64_t>& dims, TensorMaker make);

  std::vector<uint8_t> serialize() const;
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<int64_t> dims;
    uint64_t n_bytes;
    TensorMaker make;
  };
  using Sink = std::function<bool(const uint8_t*, size_t)>;
  Status write_to(const Sink& sink) const;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
  void put(const std::string& key, GgufValue v);
};

}  // namespace helios
