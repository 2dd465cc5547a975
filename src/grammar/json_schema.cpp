// JSON schema → JsonGrammar nodes. What cannot be held to byte by byte is refused by name, so
// that a client never gets JSON that only looks as if the schema held.
#include <algorithm>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "helios/json_grammar.h"

namespace helios {

using Json = nlohmann::json;
using Kind = JsonGrammar::Kind;
using Node = JsonGrammar::Node;

namespace {

const std::set<std::string>& annotations() {
  static const std::set<std::string> keys = {"title", "description", "default", "examples", "format", "$schema",
                                             "$id", "$comment", "deprecated", "readOnly", "writeOnly", "strict"};
  return keys;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> keys = {"type", "properties", "required", "additionalProperties", "items",
                                             "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                             "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"};
  return keys;
}
constexpr const char* kSupportedList =
    "type, properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, "
    "const, anyOf, oneOf, allOf (one schema), $ref, $defs";

std::string quoted_json(const std::string& s) { return Json(s).dump(); }

// JSON pointer segment rules: '~' and '/' are escaped.
std::string pointer_segment(std::string s) {
  for (size_t i = 0; (i = s.find_first_of("~/", i)) != std::string::npos; i += 2) {
    s.replace(i, 1, s[i] == '~' ? "~0" : "~1");
  }
  return s;
}

std::vector<int> first_bytes(const std::vector<Node>& nodes, int32_t id) {
  const Node& n = nodes[id];
  switch (n.kind) {
    case Kind::kObject: return {'{'};
    case Kind::kArray: return {'['};
    case Kind::kString: return {'"'};
    case Kind::kNumber:
    case Kind::kInteger: return {'-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
    case Kind::kLiterals: {
      std::vector<int> out;
      for (const auto& t : n.literals) {
        if (!t.empty()) out.push_back(static_cast<unsigned char>(t[0]));
      }
      return out;
    }
    case Kind::kUnion: {
      std::vector<int> out;
      for (int b = 0; b < 256; ++b) {
        if (n.by_first_byte[b] != JsonGrammar::kNone) out.push_back(b);
      }
      return out;
    }
  }
  return {};
}

}  // namespace

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const Json& doc) : doc_(doc), g_(std::make_shared<JsonGrammar>()) {}

  StatusOr<std::shared_ptr<const JsonGrammar>> compile() {
    HELIOS_ASSIGN_OR_RETURN(g_->root_, node_of(doc_, "#"));
    return std::shared_ptr<const JsonGrammar>(g_);
  }

  // Any JSON value, its nodes made once.
  int32_t any() {
    if (any_ != JsonGrammar::kNone) return any_;
    any_ = add({});  // the union, filled below once its alternatives exist
    Node object;
    object.kind = Kind::kObject;
    object.additional = any_;
    Node array;
    array.kind = Kind::kArray;
    array.items = any_;
    Node string;
    string.kind = Kind::kString;
    Node number;
    number.kind = Kind::kNumber;
    Node literals;
    literals.kind = Kind::kLiterals;
    literals.literals = {"false", "null", "true"};
    const std::vector<int32_t> alternatives = {add(object), add(array), add(string), add(number), add(literals)};
    Node any;
    any.kind = Kind::kUnion;
    any.by_first_byte.assign(256, JsonGrammar::kNone);
    for (int32_t a : alternatives) {
      for (int b : first_bytes(g_->nodes_, a)) any.by_first_byte[b] = a;
    }
    g_->nodes_[any_] = any;
    return any_;
  }

 private:
  int32_t add(Node n) {
    g_->nodes_.push_back(std::move(n));
    pending_.push_back(false);
    return static_cast<int32_t>(g_->nodes_.size()) - 1;
  }
  Node& node(int32_t id) { return g_->nodes_[id]; }

  static Status error(const std::string& path, const std::string& what) {
    return invalid_argument("schema at " + path + ": " + what);
  }

  StatusOr<int32_t> node_of(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any();
      return error(path, "the schema false allows no value");
    }
    if (!s.is_object()) return error(path, "a schema must be an object or a boolean, got " + std::string(s.type_name()));
    for (const auto& [key, value] : s.items()) {
      if (annotations().count(key) || supported().count(key)) continue;
      return error(path, "'" + key + "' is not supported in structured output (supported: " + kSupportedList +
                             "; annotations such as title, description and format are ignored)");
    }
    if (auto it = s.find("$ref"); it != s.end()) return ref(*it, path);
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1) return error(path + "/allOf", "only an allOf of one schema is supported");
      return node_of((*it)[0], path + "/allOf/0");
    }
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return error(path + "/enum", "enum must be a non-empty array");
      std::vector<std::string> texts;
      for (const Json& v : *it) texts.push_back(v.dump());
      return literals(std::move(texts));
    }
    if (auto it = s.find("const"); it != s.end()) return literals({it->dump()});
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) return any_of(*it, path + "/" + key);
    }
    auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
        return typed(s, "object", path);
      }
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", path);
      if (s.contains("minLength") || s.contains("maxLength")) return typed(s, "string", path);
      return any();
    }
    if (type->is_string()) return typed(s, type->get<std::string>(), path);
    if (!type->is_array() || type->empty()) return error(path + "/type", "type must be a string or a non-empty array");
    std::vector<int32_t> alternatives;
    for (size_t i = 0; i < type->size(); ++i) {
      if (!(*type)[i].is_string()) return error(path + "/type/" + std::to_string(i), "a type must be a string");
      HELIOS_ASSIGN_OR_RETURN(int32_t a, typed(s, (*type)[i].get<std::string>(), path));
      alternatives.push_back(a);
    }
    return union_of(alternatives, path + "/type");
  }

  StatusOr<int32_t> typed(const Json& s, const std::string& type, const std::string& path) {
    Node n;
    if (type == "object") {
      n.kind = Kind::kObject;
      return object(s, std::move(n), path);
    }
    if (type == "array") {
      n.kind = Kind::kArray;
      if (auto it = s.find("items"); it != s.end()) {
        if (it->is_array()) return error(path + "/items", "items as a list of schemas (tuples) is not supported");
        HELIOS_ASSIGN_OR_RETURN(n.items, node_of(*it, path + "/items"));
      } else {
        n.items = any();
      }
      HELIOS_ASSIGN_OR_RETURN(n.min_items, count_of(s, "minItems", path, 0));
      HELIOS_ASSIGN_OR_RETURN(n.max_items, count_of(s, "maxItems", path, -1));
      if (n.max_items >= 0 && n.min_items > n.max_items) return error(path, "minItems is more than maxItems");
      return add(std::move(n));
    }
    if (type == "string") {
      n.kind = Kind::kString;
      HELIOS_ASSIGN_OR_RETURN(n.min_length, count_of(s, "minLength", path, 0));
      HELIOS_ASSIGN_OR_RETURN(n.max_length, count_of(s, "maxLength", path, -1));
      if (n.max_length >= 0 && n.min_length > n.max_length) return error(path, "minLength is more than maxLength");
      return add(std::move(n));
    }
    if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::kNumber : Kind::kInteger;
      return add(std::move(n));
    }
    if (type == "boolean") return literals({"false", "true"});
    if (type == "null") return literals({"null"});
    return error(path + "/type", "unknown type '" + type +
                                     "' (types: object, array, string, number, integer, boolean, null)");
  }

  StatusOr<int32_t> object(const Json& s, Node n, const std::string& path) {
    std::map<std::string, const Json*> properties;  // by JSON-encoded name: the order the matcher needs
    std::map<std::string, std::string> names;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return error(path + "/properties", "properties must be an object");
      for (const auto& [name, schema] : it->items()) {
        const std::string q = quoted_json(name);
        const std::string encoded = q.substr(1, q.size() - 2);
        properties[encoded] = &schema;
        names[encoded] = name;
      }
    }
    // Unsaid, an object with `properties` takes only those (as llama.cpp's grammars and OpenAI's
    // strict schemas have it: a model held to a schema should not invent keys; `"properties": {}`
    // is the empty object); one without takes any.
    const auto said = s.find("additionalProperties");
    if (said == s.end()) {
      n.additional = s.contains("properties") ? JsonGrammar::kNone : any();
    } else if (said->is_boolean() && said->get<bool>()) {
      n.additional = any();
    } else if (said->is_boolean()) {
      n.additional = JsonGrammar::kNone;
    } else {
      HELIOS_ASSIGN_OR_RETURN(n.additional, node_of(*said, path + "/additionalProperties"));
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return error(path + "/required", "required must be an array of property names");
      for (const Json& name : *it) {
        if (!name.is_string()) return error(path + "/required", "required must be an array of property names");
        const std::string q = quoted_json(name.get<std::string>());
        const std::string encoded = q.substr(1, q.size() - 2);
        if (!properties.count(encoded)) {
          if (said != s.end() && n.additional == JsonGrammar::kNone) {
            return error(path + "/required", "'" + name.get<std::string>() +
                                                 "' is required but not in properties, and no other property is allowed");
          }
          properties[encoded] = nullptr;  // any value the other properties may have (any at all when closed by default)
          names[encoded] = name.get<std::string>();
        }
        required.insert(encoded);
      }
    }
    if (properties.size() > 64) return error(path + "/properties", "at most 64 properties are supported");
    for (const auto& [encoded, schema] : properties) {
      int32_t value = n.additional == JsonGrammar::kNone ? any() : n.additional;
      if (schema) {
        HELIOS_ASSIGN_OR_RETURN(value, node_of(*schema, path + "/properties/" + pointer_segment(names[encoded])));
      }
      if (required.count(encoded)) n.required |= uint64_t{1} << n.keys.size();
      n.keys.push_back(encoded);
      n.key_nodes.push_back(value);
    }
    return add(std::move(n));
  }

  StatusOr<int32_t> count_of(const Json& s, const char* key, const std::string& path, int32_t absent) {
    auto it = s.find(key);
    if (it == s.end()) return absent;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 30)) {
      return error(path + "/" + key, std::string(key) + " must be a non-negative integer");
    }
    return static_cast<int32_t>(it->get<int64_t>());
  }

  StatusOr<int32_t> literals(std::vector<std::string> texts) {
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    Node n;
    n.kind = Kind::kLiterals;
    n.literals = std::move(texts);
    return add(std::move(n));
  }

  StatusOr<int32_t> any_of(const Json& list, const std::string& path) {
    if (!list.is_array() || list.empty()) return error(path, "must be a non-empty array of schemas");
    std::vector<int32_t> alternatives;
    for (size_t i = 0; i < list.size(); ++i) {
      HELIOS_ASSIGN_OR_RETURN(int32_t a, node_of(list[i], path + "/" + std::to_string(i)));
      alternatives.push_back(a);
    }
    return union_of(alternatives, path);
  }

  // One node for alternatives that their first byte tells apart. Overlaps that one alternative
  // covers are merged (a number covers an integer, a string covers string literals; literals
  // join); any other overlap is refused.
  StatusOr<int32_t> union_of(const std::vector<int32_t>& alternatives, const std::string& path) {
    if (alternatives.size() == 1) return alternatives[0];
    std::vector<int32_t> leaves;
    for (int32_t a : alternatives) {
      if (pending_[a]) return error(path, "a $ref that refers back to itself directly inside anyOf is not supported");
      if (node(a).kind != Kind::kUnion) {
        leaves.push_back(a);
        continue;
      }
      std::set<int32_t> inner;
      for (int32_t x : node(a).by_first_byte) {
        if (x != JsonGrammar::kNone) inner.insert(x);
      }
      leaves.insert(leaves.end(), inner.begin(), inner.end());
    }
    // Literals join into one node first, so that true/false/null/enums never collide among themselves.
    std::vector<std::string> joined;
    std::vector<int32_t> rest;
    for (int32_t a : leaves) {
      if (node(a).kind == Kind::kLiterals) {
        joined.insert(joined.end(), node(a).literals.begin(), node(a).literals.end());
      } else {
        rest.push_back(a);
      }
    }
    bool has_string = false, has_number = false;
    for (int32_t a : rest) {
      has_string |= node(a).kind == Kind::kString;
      has_number |= node(a).kind == Kind::kNumber;
    }
    if (!joined.empty()) {  // literals a string or number alternative already allows
      std::vector<std::string> kept;
      for (const std::string& t : joined) {
        const bool is_string = !t.empty() && t[0] == '"';
        const bool is_number = !t.empty() && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9'));
        if ((is_string && has_string) || (is_number && has_number)) continue;
        kept.push_back(t);
      }
      if (!kept.empty()) {
        HELIOS_ASSIGN_OR_RETURN(int32_t lit, literals(std::move(kept)));
        rest.push_back(lit);
      }
    }
    if (has_number) {  // a number covers every integer
      rest.erase(std::remove_if(rest.begin(), rest.end(), [&](int32_t a) { return node(a).kind == Kind::kInteger; }),
                 rest.end());
    }
    Node u;
    u.kind = Kind::kUnion;
    u.by_first_byte.assign(256, JsonGrammar::kNone);
    for (int32_t a : rest) {
      for (int b : first_bytes(g_->nodes_, a)) {
        const int32_t other = u.by_first_byte[b];
        if (other != JsonGrammar::kNone && other != a) {
          return error(path, "two alternatives both start with '" + std::string(1, static_cast<char>(b)) +
                                 "'; structured output needs alternatives that their first character tells apart "
                                 "(for example an object and a null, not two objects)");
        }
        u.by_first_byte[b] = a;
      }
    }
    if (rest.size() == 1) return rest[0];
    return add(std::move(u));
  }

  // "#/$defs/Name" (or any JSON pointer into the document). A definition that refers to itself
  // gets its node index before it is compiled, so recursion closes on it.
  StatusOr<int32_t> ref(const Json& r, const std::string& path) {
    if (!r.is_string()) return error(path + "/$ref", "$ref must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.rfind("#", 0) != 0) {
      return error(path + "/$ref", "'" + target + "': only references inside the schema (#/$defs/...) are supported");
    }
    const Json* at = nullptr;
    try {
      at = &doc_.at(Json::json_pointer(target.substr(1)));
    } catch (const Json::exception&) {
      return error(path + "/$ref", "'" + target + "' does not name a part of the schema");
    }
    const int32_t id = add({});
    pending_[id] = true;
    refs_[target] = id;
    HELIOS_ASSIGN_OR_RETURN(int32_t compiled, node_of(*at, target));
    node(id) = node(compiled);
    pending_[id] = false;
    return id;
  }

  const Json& doc_;
  std::shared_ptr<JsonGrammar> g_;
  std::vector<bool> pending_;  // a $ref's node while its definition is compiled
  std::map<std::string, int32_t> refs_;
  int32_t any_ = JsonGrammar::kNone;
};

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  static const std::shared_ptr<const JsonGrammar> grammar = from_schema(R"({"type": "object"})").value();
  return grammar;
}

namespace {

StatusOr<Json> parse_schema(const std::string& schema_json) {
  try {
    return Json::parse(schema_json);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    return invalid_argument(std::string("the schema is not JSON: ") + e.what());
  }
}

}  // namespace

StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::from_schema(const std::string& schema_json) {
  HELIOS_ASSIGN_OR_RETURN(Json doc, parse_schema(schema_json));
  return JsonSchemaCompiler(doc).compile();
}

StatusOr<std::vector<std::shared_ptr<const JsonGrammar>>> JsonGrammar::from_schema_choice(
    const std::string& schema_json) {
  HELIOS_ASSIGN_OR_RETURN(Json doc, parse_schema(schema_json));
  auto whole = JsonSchemaCompiler(doc).compile();
  if (whole.ok()) return std::vector<std::shared_ptr<const JsonGrammar>>{*whole};
  // A top-level union and nothing else that constrains (annotations and $defs aside).
  const char* key = doc.is_object() && doc.contains("anyOf") ? "anyOf" : "oneOf";
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_array() || doc[key].empty()) return whole.status();
  for (const auto& [k, v] : doc.items()) {
    if (k != key && k != "$defs" && k != "definitions" && !annotations().count(k)) return whole.status();
  }
  std::vector<std::shared_ptr<const JsonGrammar>> out;
  for (size_t i = 0; i < doc[key].size(); ++i) {
    Json alternative = doc[key][i];
    if (!alternative.is_object()) return whole.status();
    for (const char* defs : {"$defs", "definitions"}) {
      if (doc.contains(defs) && !alternative.contains(defs)) alternative[defs] = doc[defs];
    }
    auto g = JsonSchemaCompiler(alternative).compile();
    if (!g.ok()) return whole.status();  // the union's own error names where it fails
    out.push_back(*g);
  }
  return out;
}

}  // namespace helios
