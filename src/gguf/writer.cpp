// GGUF v3 writer: metadata and tensors in memory, serialized in one pass.
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <cstring>

#include "helios/gguf.h"

namespace helios {
namespace {

constexpr uint64_t kDefaultAlignment = 32;

// The alignment the file declares (the reader honours general.alignment), else the default.
uint64_t declared_alignment(const std::vector<std::pair<std::string, GgufValue>>& kv) {
  for (const auto& [key, v] : kv) {
    if (key != "general.alignment" || !v.is_integer()) continue;
    if (v.u64 != 0 && (v.u64 & (v.u64 - 1)) == 0 && v.u64 <= (1u << 20)) return v.u64;
  }
  return kDefaultAlignment;
}

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    while (out_.size() % alignment) out_.push_back(0);
  }
  void append(const std::vector<uint8_t>& b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<uint8_t>& data() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

void put_scalar(Bytes& b, GgufType type, const GgufValue& v) {
  switch (type) {
    case GgufType::kUint8: b.put<uint8_t>(static_cast<uint8_t>(v.u64)); break;
    case GgufType::kInt8: b.put<int8_t>(static_cast<int8_t>(v.i64)); break;
    case GgufType::kUint16: b.put<uint16_t>(static_cast<uint16_t>(v.u64)); break;
    case GgufType::kInt16: b.put<int16_t>(static_cast<int16_t>(v.i64)); break;
    case GgufType::kUint32: b.put<uint32_t>(static_cast<uint32_t>(v.u64)); break;
    case GgufType::kInt32: b.put<int32_t>(static_cast<int32_t>(v.i64)); break;
    case GgufType::kUint64: b.put<uint64_t>(v.u64); break;
    case GgufType::kInt64: b.put<int64_t>(v.i64); break;
    case GgufType::kFloat32: b.put<float>(static_cast<float>(v.f64)); break;
    case GgufType::kFloat64: b.put<double>(v.f64); break;
    case GgufType::kBool: b.put<uint8_t>(v.u64 ? 1 : 0); break;
    case GgufType::kString: b.put_string(v.str); break;
    case GgufType::kArray: break;
  }
}

void put_value(Bytes& b, const GgufValue& v) {
  if (v.type != GgufType::kArray) {
    put_scalar(b, v.type, v);
    return;
  }
  b.put<uint32_t>(static_cast<uint32_t>(v.array_type));
  b.put<uint64_t>(v.array_size());
  for (const auto& s : v.strings) b.put_string(s);
  for (int64_t x : v.ints) {
    GgufValue e;
    e.i64 = x;
    e.u64 = static_cast<uint64_t>(x);
    put_scalar(b, v.array_type, e);
  }
  for (double x : v.floats) {
    GgufValue e;
    e.f64 = x;
    put_scalar(b, v.array_type, e);
  }
  for (const auto& a : v.arrays) put_value(b, a);
}

}  // namespace

void GgufWriter::put(const std::string& key, GgufValue v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::set_uint32(const std::string& key, uint32_t v) {
  GgufValue x; x.type = GgufType::kUint32; x.u64 = v; x.i64 = v; put(key, x);
}
void GgufWriter::set_int32(const std::string& key, int32_t v) {
  GgufValue x; x.type = GgufType::kInt32; x.i64 = v; x.u64 = static_cast<uint64_t>(v); put(key, x);
}
void GgufWriter::set_uint64(const std::string& key, uint64_t v) {
  GgufValue x; x.type = GgufType::kUint64; x.u64 = v; x.i64 = static_cast<int64_t>(v); put(key, x);
}
void GgufWriter::set_float32(const std::string& key, float v) {
  GgufValue x; x.type = GgufType::kFloat32; x.f64 = v; put(key, x);
}
void GgufWriter::set_bool(const std::string& key, bool v) {
  GgufValue x; x.type = GgufType::kBool; x.u64 = v; x.i64 = v; put(key, x);
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
  GgufValue x; x.type = GgufType::kString; x.str = v; put(key, std::move(x));
}
void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  GgufValue x; x.type = GgufType::kArray; x.array_type = GgufType::kString; x.strings = v;
  put(key, std::move(x));
}
void GgufWriter::set_float32_array(const std::string& key, const std::vector<float>& v) {
  GgufValue x; x.type = GgufType::kArray; x.array_type = GgufType::kFloat32;
  x.floats.assign(v.begin(), v.end());
  put(key, std::move(x));
}
void GgufWriter::set_int32_array(const std::string& key, const std::vector<int32_t>& v) {
  GgufValue x; x.type = GgufType::kArray; x.array_type = GgufType::kInt32;
  x.ints.assign(v.begin(), v.end());
  put(key, std::move(x));
}
void GgufWriter::set_value(const std::string& key, const GgufValue& v) { put(key, v); }

Status GgufWriter::add_tensor(const std::string& name, TensorType type,
                              const std::vector<int64_t>& dims, std::vector<uint8_t> bytes) {
  const size_t size = bytes.size();
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  HELIOS_RETURN_IF_ERROR(add_tensor_lazy(name, type, dims, [shared] { return *shared; }));
  if (tensors_.back().n_bytes != size) {
    const uint64_t expected = tensors_.back().n_bytes;
    tensors_.pop_back();
    return invalid_argument("tensor '" + name + "': " + std::to_string(size) + " bytes given, " +
                            std::to_string(expected) + " expected");
  }
  return ok_status();
}

Status GgufWriter::add_tensor_lazy(const std::string& name, TensorType type,
                                   const std::vector<int64_t>& dims, TensorMaker make) {
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  if (!traits) return invalid_argument("tensor '" + name + "': unknown tensor type");
  if (dims.empty() || dims.size() > 4) return invalid_argument("tensor '" + name + "': needs 1..4 dims");
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0) return invalid_argument("tensor '" + name + "': dimensions must be > 0");
    n *= d;
  }
  if (dims[0] % traits->block_elems != 0) {
    return invalid_argument("tensor '" + name + "': row length " + std::to_string(dims[0]) +
                            " is not a multiple of the " + traits->name + " block size " +
                            std::to_string(traits->block_elems));
  }
  for (const auto& t : tensors_) {
    if (t.name == name) return invalid_argument("tensor '" + name + "' added twice");
  }
  const auto n_bytes = static_cast<uint64_t>(n / traits->block_elems * traits->block_bytes);
  tensors_.push_back({name, type, dims, n_bytes, std::move(make)});
  return ok_status();
}

Status GgufWriter::write_to(const Sink& sink) const {
  Bytes b;
  b.put<uint32_t>(0x46554747);  // "GGUF"
  b.put<uint32_t>(3);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size());
  for (const auto& [key, value] : kv_) {
    b.put_string(key);
    b.put<uint32_t>(static_cast<uint32_t>(value.type));
    put_value(b, value);
  }
  const uint64_t alignment = declared_alignment(kv_);
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    b.put_string(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) b.put<uint64_t>(static_cast<uint64_t>(d));
    b.put<uint32_t>(static_cast<uint32_t>(t.type));
    b.put<uint64_t>(offset);
    offset += (t.n_bytes + alignment - 1) / alignment * alignment;
  }
  b.pad_to(alignment);
  if (!sink(b.data().data(), b.data().size())) return internal_error("write failed in the header");
  const std::vector<uint8_t> zeros(alignment, 0);
  for (const auto& t : tensors_) {
    const std::vector<uint8_t> bytes = t.make();
    if (bytes.size() != t.n_bytes) {
      return internal_error("tensor '" + t.name + "' produced " + std::to_string(bytes.size()) +
                            " bytes, " + std::to_string(t.n_bytes) + " expected");
    }
    const size_t pad = (alignment - bytes.size() % alignment) % alignment;
    if (!sink(bytes.data(), bytes.size()) || !sink(zeros.data(), pad)) {
      return internal_error("write failed in tensor '" + t.name + "'");
    }
  }
  return ok_status();
}

std::vector<uint8_t> GgufWriter::serialize() const {
  std::vector<uint8_t> out;
  Status s = write_to([&](const uint8_t* p, size_t n) {
    out.insert(out.end(), p, p + n);
    return true;
  });
  assert(s.ok());
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".partial";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return invalid_argument("cannot create '" + tmp + "': " + std::strerror(errno));
  Status s = write_to([f](const uint8_t* p, size_t n) { return std::fwrite(p, 1, n, f) == n; });
  const bool closed = std::fclose(f) == 0;
  if (!s.ok() || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return internal_error("cannot write '" + path + "': " + (s.ok() ? std::strerror(errno) : s.message()));
  }
  return ok_status();
}

}  // namespace helios
