#include "config/yaml_section.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>

#include "helios/config.h"

namespace helios::config_detail {

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring letters ("enigne" → "engine") each cost 1. Case is ignored.
size_t edit_distance(std::string_view a, std::string_view b) {
  const auto lower = [](char c) { return std::tolower(static_cast<unsigned char>(c)); };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

Status config_error(const ConfigSource& source, const YAML::Mark& mark, std::string_view key,
                    std::string_view what) {
  // A mark of -1 (yaml-cpp's null_mark) has no position; cite the file's start.
  const int line = mark.line >= 0 ? mark.line + 1 : 1;
  const int column = mark.column >= 0 ? mark.column + 1 : 1;
  std::string message = source.file_name + ":" + std::to_string(line) + ":" +
                        std::to_string(column) + ": ";
  message += key.empty() ? "(top level)" : std::string(key);
  message += ": ";
  message += what;
  return invalid_argument(std::move(message));
}

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: return "no value";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
  }
  return "an unknown node";
}

std::string closest_match(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    size_t distance = edit_distance(word, candidate);
    // "kv_cache_bytes" → "kv_cache": a known key inside the unknown one is a strong hint.
    const bool contains = candidate.size() >= 3 && word.find(candidate) != std::string_view::npos;
    if (contains) distance = std::min<size_t>(distance, 1);
    // A third of the letters may differ; short words ("gpu" vs "cpu") only by case.
    const size_t allowed =
        word.size() < 4 ? 0 : std::max<size_t>(1, std::max(word.size(), candidate.size()) / 3);
    if (distance <= allowed && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string join(const std::vector<std::string_view>& words) {
  std::string out;
  for (std::string_view word : words) {
    if (!out.empty()) out += ", ";
    out += word;
  }
  return out;
}

std::string resolve_path(const ConfigSource& source, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_relative() && !source.base_dir.empty()) p = std::filesystem::path(source.base_dir) / p;
  return p.lexically_normal().string();
}

StatusOr<MapReader> MapReader::open(const ConfigSource& source, const YAML::Node& node,
                                    const YAML::Mark& where, std::string path,
                                    std::vector<std::string_view> known_keys) {
  MapReader reader;
  reader.source_ = &source;
  reader.path_ = std::move(path);
  reader.mark_ = node.IsDefined() && !node.IsNull() ? node.Mark() : where;
  if (!node.IsDefined() || node.IsNull()) return reader;
  const std::string section = reader.path_.empty() ? "top-level" : "'" + reader.path_ + "'";
  if (!node.IsMap()) {
    return config_error(source, node.Mark(), reader.path_,
                        "expected a map of keys (" + join(known_keys) + "), got " +
                            describe_node(node));
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: a map iterator's `->` yields a temporary pair, so references would dangle.
    const YAML::Node key_node = it->first;
    const YAML::Node value = it->second;
    if (!key_node.IsScalar()) {
      return config_error(source, key_node.Mark(), reader.path_,
                          "expected a key name, got " + describe_node(key_node));
    }
    const std::string key = key_node.Scalar();
    if (const Entry* first = reader.find(key)) {
      return config_error(source, key_node.Mark(), reader.key_path(key),
                          "given twice (first at line " +
                              std::to_string(first->key_node.Mark().line + 1) +
                              "); give each key once");
    }
    if (std::find(known_keys.begin(), known_keys.end(), key) == known_keys.end()) {
      std::string what = "unknown key; ";
      if (std::string hint = closest_match(key, known_keys); !hint.empty()) {
        what += "did you mean '" + hint + "'? Valid ";
      } else {
        what += "valid ";
      }
      what += section + " keys: " + join(known_keys);
      return config_error(source, key_node.Mark(), reader.key_path(key), what);
    }
    reader.entries_.push_back({key, key_node, value});
  }
  return reader;
}

const MapReader::Entry* MapReader::find(std::string_view key) const {
  for (const Entry& entry : entries_) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

const YAML::Node& MapReader::value(std::string_view key) const {
  const Entry* entry = find(key);
  assert(entry != nullptr && "MapReader::value of an absent key");
  return entry->value;
}

std::string MapReader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

YAML::Mark MapReader::mark_of(std::string_view key) const {
  const Entry* entry = find(key);
  if (entry == nullptr) return mark_;
  // An empty value's mark is wherever the parser stood next (often the following line).
  if (entry->value.IsNull()) return entry->key_node.Mark();
  return entry->value.Mark();
}

Status MapReader::error(std::string_view key, std::string_view what) const {
  return config_error(*source_, mark_of(key), key_path(key), what);
}

Status MapReader::scalar_text(std::string_view key, std::string_view expected, bool allow_quoted,
                              std::string* out) const {
  const YAML::Node& node = value(key);
  if (!node.IsScalar()) {
    return error(key, "expected " + std::string(expected) + ", got " + describe_node(node));
  }
  // yaml-cpp tags quoted scalars "!" and plain ones "?".
  if (!allow_quoted && node.Tag() == "!") {
    return error(key, "expected " + std::string(expected) + ", got the quoted string '" +
                          node.Scalar() + "'; write it without quotes");
  }
  *out = node.Scalar();
  return ok_status();
}

Status MapReader::read_string(std::string_view key, std::string* out) const {
  if (!has(key)) return ok_status();
  return scalar_text(key, "a string", /*allow_quoted=*/true, out);
}

Status MapReader::read_int(std::string_view key, int32_t* out) const {
  if (!has(key)) return ok_status();
  std::string text;
  HELIOS_RETURN_IF_ERROR(scalar_text(key, "an integer", /*allow_quoted=*/false, &text));
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc() && ptr == end &&
       (value > std::numeric_limits<int32_t>::max() ||
        value < std::numeric_limits<int32_t>::min()))) {
    return error(key, "must be between " + std::to_string(std::numeric_limits<int32_t>::min()) +
                          " and " + std::to_string(std::numeric_limits<int32_t>::max()) +
                          ", got " + text);
  }
  if (ec != std::errc() || ptr != end || text.empty()) {
    return error(key, "expected an integer, got '" + text + "'");
  }
  *out = static_cast<int32_t>(value);
  return ok_status();
}

Status MapReader::read_double(std::string_view key, double* out) const {
  if (!has(key)) return ok_status();
  std::string text;
  HELIOS_RETURN_IF_ERROR(scalar_text(key, "a number", /*allow_quoted=*/false, &text));
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(value)) {
    return error(key, "expected a number, got '" + text + "'");
  }
  *out = value;
  return ok_status();
}

Status MapReader::read_byte_size(std::string_view key, int64_t* out) const {
  if (!has(key)) return ok_status();
  std::string text;
  HELIOS_RETURN_IF_ERROR(scalar_text(key, "a size such as 512MiB", /*allow_quoted=*/true, &text));
  StatusOr<int64_t> bytes = parse_byte_size(text);
  if (!bytes.ok()) return error(key, bytes.status().message());
  *out = *bytes;
  return ok_status();
}

Status MapReader::read_string_list(std::string_view key, std::vector<std::string>* out) const {
  if (!has(key)) return ok_status();
  const YAML::Node& node = value(key);
  if (node.IsNull()) {
    out->clear();
    return ok_status();
  }
  if (!node.IsSequence()) {
    return error(key, "expected a list of strings, got " + describe_node(node));
  }
  std::vector<std::string> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    if (!item.IsScalar()) {
      return config_error(*source_, item.Mark(), key_path(key) + "[" + std::to_string(i) + "]",
                          "expected a string, got " + describe_node(item));
    }
    items.push_back(item.Scalar());
  }
  *out = std::move(items);
  return ok_status();
}

Status MapReader::read_int_list(std::string_view key, std::vector<int32_t>* out) const {
  if (!has(key)) return ok_status();
  const YAML::Node& node = value(key);
  if (node.IsNull()) {
    out->clear();
    return ok_status();
  }
  if (!node.IsSequence()) {
    return error(key, "expected a list of integers such as [6, 12], got " + describe_node(node));
  }
  std::vector<int32_t> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    const std::string item_key = key_path(key) + "[" + std::to_string(i) + "]";
    int32_t value = 0;
    const std::string text = item.IsScalar() ? item.Scalar() : "";
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    // Quoted items are strings in YAML, as for single integers.
    if (!item.IsScalar() || item.Tag() == "!" || ec != std::errc() ||
        ptr != text.data() + text.size() || text.empty()) {
      return config_error(*source_, item.Mark(), item_key,
                          "expected an integer, got " + describe_node(item));
    }
    items.push_back(value);
  }
  *out = std::move(items);
  return ok_status();
}

Status MapReader::read_bool(std::string_view key, bool* out) const {
  if (!has(key)) return ok_status();
  std::string text;
  HELIOS_RETURN_IF_ERROR(scalar_text(key, "true or false", /*allow_quoted=*/false, &text));
  if (text != "true" && text != "false") {
    return error(key, "expected true or false, got '" + text + "'");
  }
  *out = text == "true";
  return ok_status();
}

std::string MapReader::choice_error(std::string_view got,
                                    const std::vector<std::string_view>& names) {
  std::string what = "must be one of " + join(names) + ", got '" + std::string(got) + "'";
  if (std::string hint = closest_match(got, names); !hint.empty()) {
    what += "; did you mean '" + hint + "'?";
  }
  return what;
}

}  // namespace helios::config_detail
