// GGUF reader: header, metadata and tensor index over an mmap, every field bounds-checked.
//
// Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
// n_kv × {string key, u32 type, value}, n_tensors × {string name, u32 n_dims, u64 dims[n_dims],
// u32 type, u64 offset}, padding to `general.alignment`, then the tensor data.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "helios/gguf.h"

namespace helios {
namespace {

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr uint32_t kMaxArrayDepth = 4;  // nested arrays deeper than this are refused

std::string hex_offset(uint64_t off) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(off));
  return buf;
}

// A cursor over the file image. Every read checks the remaining size first.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Reports the offset where the most recently read field starts.
  Status error(const std::string& field, const std::string& what) const {
    return error_at(field_pos_, field, what);
  }
  Status error_at(uint64_t at, const std::string& field, const std::string& what) const {
    return data_loss(file_ + ": " + field + " at offset " + hex_offset(at) + ": " + what);
  }

  template <typename T>
  Status read(T* out, const std::string& field) {
    field_pos_ = pos_;
    if (remaining() < sizeof(T)) {
      return error(field, "file ends after " + std::to_string(size_) + " bytes (truncated?)");
    }
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return ok_status();
  }

  Status read_string(std::string* out, const std::string& field) {
    uint64_t len = 0;
    const uint64_t at = pos_;
    HELIOS_RETURN_IF_ERROR(read(&len, field + " length"));
    if (len > remaining()) {
      pos_ = at;
      field_pos_ = at;
      return error(field, "string length " + std::to_string(len) + " exceeds the " +
                              std::to_string(remaining() - 8) + " bytes left in the file");
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return ok_status();
  }

  // Refuses counts that cannot fit in what is left, before anything is allocated for them.
  Status check_count(uint64_t count, uint64_t min_bytes_each, const std::string& field) const {
    if (min_bytes_each != 0 && count > remaining() / min_bytes_each) {
      return error(field, "count " + std::to_string(count) + " needs at least " +
                              std::to_string(min_bytes_each) + " bytes each, but only " +
                              std::to_string(remaining()) + " bytes are left");
    }
    return ok_status();
  }

 private:
  const uint8_t* base_;
  size_t size_;
  uint64_t pos_ = 0;
  uint64_t field_pos_ = 0;  // start of the field read last
  const std::string& file_;
};

// Smallest encoding of one value of `type` (used to bound array counts).
uint64_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: return 8;
    case GgufType::kArray: return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

Status read_scalar(Cursor& c, GgufType type, GgufValue* v, const std::string& field) {
  v->type = type;
  switch (type) {
    case GgufType::kUint8: { uint8_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->u64 = x; v->i64 = x; break; }
    case GgufType::kInt8: { int8_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufType::kUint16: { uint16_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->u64 = x; v->i64 = x; break; }
    case GgufType::kInt16: { int16_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufType::kUint32: { uint32_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->u64 = x; v->i64 = x; break; }
    case GgufType::kInt32: { int32_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufType::kUint64: { uint64_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->u64 = x; v->i64 = static_cast<int64_t>(x); break; }
    case GgufType::kInt64: { int64_t x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufType::kFloat32: { float x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->f64 = x; break; }
    case GgufType::kFloat64: { double x; HELIOS_RETURN_IF_ERROR(c.read(&x, field)); v->f64 = x; break; }
    case GgufType::kBool: {
      uint8_t x;
      HELIOS_RETURN_IF_ERROR(c.read(&x, field));
      if (x > 1) return c.error(field, "bool value " + std::to_string(x) + " is neither 0 nor 1");
      v->u64 = x; v->i64 = x;
      break;
    }
    case GgufType::kString: return c.read_string(&v->str, field);
    case GgufType::kArray: return internal_error("read_scalar on an array");
  }
  return ok_status();
}

Status read_value(Cursor& c, GgufType type, GgufValue* v, const std::string& field, uint32_t depth) {
  if (type != GgufType::kArray) return read_scalar(c, type, v, field);
  if (depth >= kMaxArrayDepth) return c.error_at(c.pos(), field, "arrays nested deeper than 4 levels");
  v->type = GgufType::kArray;
  uint32_t elem_type = 0;
  HELIOS_RETURN_IF_ERROR(c.read(&elem_type, field + " element type"));
  if (!valid_type(elem_type)) {
    return c.error(field, "unknown array element type id " + std::to_string(elem_type) + " (valid: 0..12)");
  }
  v->array_type = static_cast<GgufType>(elem_type);
  uint64_t count = 0;
  HELIOS_RETURN_IF_ERROR(c.read(&count, field + " array length"));
  HELIOS_RETURN_IF_ERROR(c.check_count(count, min_value_bytes(v->array_type), field + " array length"));
  for (uint64_t i = 0; i < count; ++i) {
    GgufValue e;
    HELIOS_RETURN_IF_ERROR(read_value(c, v->array_type, &e, field + "[" + std::to_string(i) + "]", depth + 1));
    switch (v->array_type) {
      case GgufType::kString: v->strings.push_back(std::move(e.str)); break;
      case GgufType::kFloat32: case GgufType::kFloat64: v->floats.push_back(e.f64); break;
      case GgufType::kArray: v->arrays.push_back(std::move(e)); break;
      default: v->ints.push_back(e.i64); break;
    }
  }
  return ok_status();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GgufValue

bool GgufValue::is_integer() const {
  return type != GgufType::kFloat32 && type != GgufType::kFloat64 && type != GgufType::kString &&
         type != GgufType::kArray;
}
bool GgufValue::is_float() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }

size_t GgufValue::array_size() const {
  return strings.size() + ints.size() + floats.size() + arrays.size();
}

std::string GgufValue::to_display_string(size_t max_items) const {
  switch (type) {
    case GgufType::kString: return str.size() > 200 ? str.substr(0, 200) + "…" : str;
    case GgufType::kBool: return u64 ? "true" : "false";
    case GgufType::kFloat32: case GgufType::kFloat64: return std::to_string(f64);
    case GgufType::kArray: {
      std::string out = std::string("[") + gguf_type_name(array_type) + " × " +
                        std::to_string(array_size()) + "]";
      for (size_t i = 0; i < std::min(max_items, array_size()); ++i) {
        out += i ? ", " : " ";
        if (!strings.empty()) out += "'" + strings[i] + "'";
        else if (!ints.empty()) out += std::to_string(ints[i]);
        else if (!floats.empty()) out += std::to_string(floats[i]);
        else out += arrays[i].to_display_string(2);
      }
      if (array_size() > max_items) out += ", …";
      return out;
    }
    default:
      return (type == GgufType::kInt8 || type == GgufType::kInt16 || type == GgufType::kInt32 ||
              type == GgufType::kInt64) ? std::to_string(i64) : std::to_string(u64);
  }
}

const char* gguf_type_name(GgufType type) {
  static const char* kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < 13 ? kNames[i] : "unknown";
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// GgufFile

StatusOr<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return not_found("cannot open model file '" + path + "': " + std::strerror(errno));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("'" + path + "' is not a regular file");
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return internal_error("cannot mmap '" + path + "': " + std::strerror(err));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  HELIOS_RETURN_IF_ERROR(file->parse_all());
  return file;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* bytes, size_t size,
                                                    const std::string& name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = name;
  file->base_ = bytes;
  file->size_ = size;
  HELIOS_RETURN_IF_ERROR(file->parse_all());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

Status GgufFile::parse_all() {
  Cursor c(base_, size_, path_);
  uint32_t magic = 0;
  HELIOS_RETURN_IF_ERROR(c.read(&magic, "magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return data_loss(path_ + ": magic at offset 0x0: expected \"GGUF\", found bytes " +
                     hex_offset(magic) + " (not a GGUF model file)");
  }
  HELIOS_RETURN_IF_ERROR(c.read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return data_loss(path_ + ": version at offset 0x4: GGUF version " + std::to_string(version_) +
                     " is not supported (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  // A key-value pair needs ≥ 13 bytes (key length, key type, a 1-byte value); a tensor info ≥ 24.
  HELIOS_RETURN_IF_ERROR(c.read(&n_tensors, "tensor count"));
  HELIOS_RETURN_IF_ERROR(c.check_count(n_tensors, 24, "tensor count"));
  HELIOS_RETURN_IF_ERROR(c.read(&n_kv, "metadata count"));
  HELIOS_RETURN_IF_ERROR(c.check_count(n_kv, 13, "metadata count"));

  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string field = "metadata[" + std::to_string(i) + "]";
    std::string key;
    const uint64_t key_pos = c.pos();
    HELIOS_RETURN_IF_ERROR(c.read_string(&key, field + " key"));
    uint32_t type = 0;
    HELIOS_RETURN_IF_ERROR(c.read(&type, "type of '" + key + "'"));
    if (!valid_type(type)) {
      return c.error("type of '" + key + "'", "unknown value type id " + std::to_string(type) + " (valid: 0..12)");
    }
    GgufValue value;
    HELIOS_RETURN_IF_ERROR(read_value(c, static_cast<GgufType>(type), &value, "'" + key + "'", 0));
    if (kv_.count(key)) return c.error_at(key_pos, "'" + key + "'", "duplicate metadata key");
    key_order_.push_back(key);
    kv_.emplace(key, std::move(value));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u64 == 0 || (a->u64 & (a->u64 - 1)) != 0 || a->u64 > (1u << 20)) {
      return data_loss(path_ + ": general.alignment = " + a->to_display_string() +
                       " must be a power of two between 1 and 1048576");
    }
    alignment_ = a->u64;
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    const uint64_t name_pos = c.pos();
    HELIOS_RETURN_IF_ERROR(c.read_string(&t.name, "tensor[" + std::to_string(i) + "] name"));
    const std::string field = "tensor '" + t.name + "'";
    uint32_t n_dims = 0;
    HELIOS_RETURN_IF_ERROR(c.read(&n_dims, field + " n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return c.error(field, "n_dims = " + std::to_string(n_dims) + " (must be 1..4)");
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      HELIOS_RETURN_IF_ERROR(c.read(&dim, field + " dim " + std::to_string(d)));
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(n_elements) > (uint64_t{1} << 50) / dim) {
        return c.error(field, "dimension " + std::to_string(d) + " = " + std::to_string(dim) +
                                  " is zero or makes the tensor impossibly large");
      }
      t.dims.push_back(static_cast<int64_t>(dim));
      n_elements *= static_cast<int64_t>(dim);
    }
    uint32_t type = 0;
    HELIOS_RETURN_IF_ERROR(c.read(&type, field + " type"));
    auto traits = tensor_type_traits(type);
    if (!traits) return c.error(field, "unknown tensor type id " + std::to_string(type));
    t.type = static_cast<TensorType>(type);
    if (t.dims[0] % traits->block_elems != 0) {
      return c.error(field, "row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
                                traits->name + " block size " + std::to_string(traits->block_elems));
    }
    t.n_bytes = static_cast<uint64_t>(n_elements / traits->block_elems * traits->block_bytes);
    HELIOS_RETURN_IF_ERROR(c.read(&t.offset_bytes, field + " offset"));
    if (t.offset_bytes % alignment_ != 0) {
      return c.error(field, "data offset " + std::to_string(t.offset_bytes) +
                                " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (tensor_index_.count(t.name)) return c.error_at(name_pos, field, "duplicate tensor name");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Tensor data starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_ && !tensors_.empty()) {
    return data_loss(path_ + ": tensor data at offset " + hex_offset(data_start) +
                     " starts past the end of the file (" + std::to_string(size_) + " bytes)");
  }
  const uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
  for (auto& t : tensors_) {
    if (t.offset_bytes > data_size || t.n_bytes > data_size - t.offset_bytes) {
      return data_loss(path_ + ": tensor '" + t.name + "' data [" +
                       hex_offset(data_start + t.offset_bytes) + ", +" + std::to_string(t.n_bytes) +
                       " bytes) runs past the end of the file (" + std::to_string(size_) +
                       " bytes; truncated?)");
    }
    t.data = base_ + data_start + t.offset_bytes;
  }
  return ok_status();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return not_found(path_ + ": metadata key '" + key + "' is missing");
  if (v->type != GgufType::kString) {
    return invalid_argument(path_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) + ", expected string");
  }
  return v->str;
}

StatusOr<uint64_t> GgufFile::get_uint(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return not_found(path_ + ": metadata key '" + key + "' is missing");
  // A u64 at or above 2^63 has a negative i64 but is still non-negative.
  const bool negative = v->type != GgufType::kUint64 && v->i64 < 0;
  if (!v->is_integer() || negative) {
    return invalid_argument(path_ + ": metadata '" + key + "' = " + v->to_display_string() +
                            " (" + gguf_type_name(v->type) + "), expected a non-negative integer");
  }
  return v->u64;
}

StatusOr<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return not_found(path_ + ": metadata key '" + key + "' is missing");
  if (v->is_float()) return v->f64;
  if (v->type == GgufType::kUint64) return static_cast<double>(v->u64);
  if (v->is_integer()) return static_cast<double>(v->i64);
  return invalid_argument(path_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) + ", expected a number");
}

StatusOr<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return not_found(path_ + ": metadata key '" + key + "' is missing");
  if (v->type != GgufType::kBool) {
    return invalid_argument(path_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) + ", expected bool");
  }
  return v->u64 != 0;
}

const std::vector<std::string>* GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  return v && v->type == GgufType::kArray && v->array_type == GgufType::kString ? &v->strings : nullptr;
}

const std::vector<int64_t>* GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufType::kArray) return nullptr;
  const bool integer = v->array_type != GgufType::kString && v->array_type != GgufType::kArray &&
                       v->array_type != GgufType::kFloat32 && v->array_type != GgufType::kFloat64;
  return integer ? &v->ints : nullptr;
}

const std::vector<double>* GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  const bool fl = v && v->type == GgufType::kArray &&
                  (v->array_type == GgufType::kFloat32 || v->array_type == GgufType::kFloat64);
  return fl ? &v->floats : nullptr;
}

}  // namespace helios
