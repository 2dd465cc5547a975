// Reading one YAML mapping as one config section: typed reads that fail with
// "FILE:LINE:COLUMN: KEY: what is wrong; what would be valid", unknown-key and duplicate-key checks.
// Internal to src/config/; nothing outside the config module includes yaml-cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "helios/status.h"

namespace helios::config_detail {

// Where the text came from: the name errors cite, and the directory relative paths resolve against.
struct ConfigSource {
  std::string file_name;
  std::string base_dir;  // "" → relative paths stay relative (to the working directory)
};

// "FILE:LINE:COLUMN: KEY: what" with LINE and COLUMN 1-based (yaml-cpp's marks are 0-based).
Status config_error(const ConfigSource& source, const YAML::Mark& mark, std::string_view key,
                    std::string_view what);

// "a map", "a list", "no value", "'abc'": how an error names what it found.
std::string describe_node(const YAML::Node& node);

// The entry of `candidates` nearest to `word` by edit distance, or "" when none is close.
std::string closest_match(std::string_view word, const std::vector<std::string_view>& candidates);

// "a, b, c"
std::string join(const std::vector<std::string_view>& words);

// `path` resolved against the config file's directory (absolute paths are kept), normalized.
std::string resolve_path(const ConfigSource& source, const std::string& path);

class MapReader {
 public:
  // Opens `node` as the section `path` ("" for the top level, "engine", "models[0]"). An absent or
  // empty node is an empty section (every key keeps its default). Fails unless `node` is a map
  // whose keys are all in `known_keys`, each given once. `where` is what errors cite when the
  // section itself is absent: the mark of its parent.
  static StatusOr<MapReader> open(const ConfigSource& source, const YAML::Node& node,
                                  const YAML::Mark& where, std::string path,
                                  std::vector<std::string_view> known_keys);

  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Precondition: has(key).
  const YAML::Node& value(std::string_view key) const;
  std::string key_path(std::string_view key) const;  // "engine.block_size"
  // Where errors about `key` point: its value; the key when the value is empty; else the section.
  YAML::Mark mark_of(std::string_view key) const;
  Status error(std::string_view key, std::string_view what) const;
  const ConfigSource& source() const { return *source_; }
  const YAML::Mark& mark() const { return mark_; }

  // Typed reads. An absent key leaves *out unchanged: the struct's default stands.
  Status read_string(std::string_view key, std::string* out) const;
  Status read_int(std::string_view key, int32_t* out) const;
  Status read_double(std::string_view key, double* out) const;
  Status read_byte_size(std::string_view key, int64_t* out) const;  // parse_byte_size's syntax
  Status read_string_list(std::string_view key, std::vector<std::string>* out) const;
  Status read_int_list(std::string_view key, std::vector<int32_t>* out) const;
  Status read_bool(std::string_view key, bool* out) const;  // true | false

  // One of a fixed set of names, e.g. {{"recompute", kRecompute}, {"swap", kSwap}}.
  template <typename T>
  Status read_choice(std::string_view key, const std::vector<std::pair<std::string_view, T>>& choices,
                     T* out) const {
    if (!has(key)) return ok_status();
    std::string text;
    HELIOS_RETURN_IF_ERROR(read_string(key, &text));
    std::vector<std::string_view> names;
    for (const auto& [name, value] : choices) {
      if (text == name) {
        *out = value;
        return ok_status();
      }
      names.push_back(name);
    }
    return error(key, choice_error(text, names));
  }

  // "must be one of a, b, got 'x'; did you mean 'a'?"
  static std::string choice_error(std::string_view got, const std::vector<std::string_view>& names);

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };

  const Entry* find(std::string_view key) const;
  // A scalar's text; fails (naming the expected type) for maps, lists, empty values and, when
  // `allow_quoted` is false, quoted strings: `"16"` is a string in YAML, not a number.
  Status scalar_text(std::string_view key, std::string_view expected, bool allow_quoted,
                     std::string* out) const;

  const ConfigSource* source_ = nullptr;  // outlives every reader: owned by parse_config
  YAML::Mark mark_;
  std::string path_;
  std::vector<Entry> entries_;
};

}  // namespace helios::config_detail
