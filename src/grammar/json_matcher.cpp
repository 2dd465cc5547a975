// The byte walk of structured output. Each frame is one value being written; a value that ends
// only when a byte cannot extend it (a number, a literal that is a prefix of another) hands that
// byte on to the frame below.
#include <algorithm>
#include <utility>

#include "helios/json_grammar.h"

namespace helios {
namespace {

using Frame = JsonMatcher::Frame;
using Kind = JsonGrammar::Kind;
using Node = JsonGrammar::Node;

// Longest run of whitespace between two tokens: enough for pretty-printed JSON, too little for a
// model to spend its tokens on blank lines.
constexpr int kMaxWhitespace = 40;

enum ObjectPhase : uint8_t { kObjOpen, kObjKeyDue, kObjInKey, kObjColon, kObjInValue, kObjNext };
enum ArrayPhase : uint8_t { kArrOpen, kArrItemDue, kArrInValue, kArrNext };
// Numbers: start, after '-', after a leading 0, integer digits, after '.', fraction digits,
// after 'e', after the exponent's sign, exponent digits.
enum NumberPhase : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

enum class Step { kTaken, kRefeed, kReject };

bool is_ws(unsigned char b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
bool is_hex(unsigned char b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// Whitespace where the frame allows it; false once the run is too long.
bool take_ws(Frame& f) { return ++f.whitespace <= kMaxWhitespace; }

bool number_can_end(const Frame& f) {
  return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp;
}
bool literal_can_end(const Frame& f, const Node& n) {
  return f.lo < f.hi && static_cast<int32_t>(n.literals[f.lo].size()) == f.pos;
}

class Walk {
 public:
  Walk(const JsonGrammar& g, std::vector<Frame>& st) : nodes_(g.nodes()), st_(st) {}

  bool feed(unsigned char b) {
    while (!st_.empty()) {
      switch (step(b)) {
        case Step::kTaken: return true;
        case Step::kReject: return false;
        case Step::kRefeed: break;  // the top frame ended without b; the one below takes it
      }
    }
    return false;  // the value is over: nothing may follow
  }

  // The top frame's value is whole: it leaves, and the frame below moves past it.
  void end_value() {
    st_.pop_back();
    if (st_.empty()) return;
    Frame& parent = st_.back();
    parent.whitespace = 0;
    if (parent.kind == Frame::kObject) {
      parent.phase = kObjNext;
    } else if (parent.kind == Frame::kArray) {
      ++parent.count;
      parent.phase = kArrNext;
    }
  }

 private:
  Step step(unsigned char b) {
    Frame& f = st_.back();
    switch (f.kind) {
      case Frame::kValue: return value(f, b);
      case Frame::kObject: return object(f, b);
      case Frame::kArray: return array(f, b);
      case Frame::kString:
      case Frame::kKey: return string(f, b);
      case Frame::kNumber: return number(f, b);
      case Frame::kLiteral: return literal(f, b);
    }
    return Step::kReject;
  }

  void push_value(int32_t node) {
    Frame v;
    v.kind = Frame::kValue;
    v.node = node;
    st_.push_back(v);
  }

  // A value's first byte picks what it is (through a union, the alternative it starts).
  Step value(Frame& f, unsigned char b) {
    if (is_ws(b)) return take_ws(f) ? Step::kTaken : Step::kReject;
    int32_t id = f.node;
    while (nodes_[id].kind == Kind::kUnion) {
      id = nodes_[id].by_first_byte[b];
      if (id == JsonGrammar::kNone) return Step::kReject;
    }
    const Node& n = nodes_[id];
    Frame v;
    v.node = id;
    switch (n.kind) {
      case Kind::kObject:
        if (b != '{') return Step::kReject;
        v.kind = Frame::kObject;
        v.phase = kObjOpen;
        f = v;
        return Step::kTaken;
      case Kind::kArray:
        if (b != '[') return Step::kReject;
        v.kind = Frame::kArray;
        v.phase = kArrOpen;
        f = v;
        return Step::kTaken;
      case Kind::kString:
        if (b != '"') return Step::kReject;
        v.kind = Frame::kString;
        f = v;
        return Step::kTaken;
      case Kind::kNumber:
      case Kind::kInteger:
        v.kind = Frame::kNumber;
        v.phase = kNumStart;
        f = v;
        return number(f, b);
      case Kind::kLiterals:
        v.kind = Frame::kLiteral;
        v.hi = static_cast<int32_t>(n.literals.size());
        f = v;
        return literal(f, b);
      case Kind::kUnion: break;
    }
    return Step::kReject;
  }

  // Another property may start: one not given yet, or any name where others are allowed.
  bool key_may_start(const Frame& f) const {
    const Node& n = nodes_[f.node];
    if (n.additional != JsonGrammar::kNone) return true;
    for (size_t k = 0; k < n.keys.size(); ++k) {
      if (!(f.used >> k & 1)) return true;
    }
    return false;
  }

  Step start_key(Frame& f) {
    if (!key_may_start(f)) return Step::kReject;
    f.phase = kObjInKey;
    f.whitespace = 0;
    Frame k;
    k.kind = Frame::kKey;
    k.node = f.node;
    k.hi = static_cast<int32_t>(nodes_[f.node].keys.size());
    k.used = f.used;
    st_.push_back(k);  // f is not used past this point
    return Step::kTaken;
  }

  Step object(Frame& f, unsigned char b) {
    const Node& n = nodes_[f.node];
    const bool ws = is_ws(b);
    if (ws && f.phase != kObjInKey && f.phase != kObjInValue) return take_ws(f) ? Step::kTaken : Step::kReject;
    const bool can_close = (f.used & n.required) == n.required;
    switch (f.phase) {
      case kObjOpen:
        if (b == '"') return start_key(f);
        if (b == '}' && can_close) return end_value(), Step::kTaken;
        return Step::kReject;
      case kObjKeyDue:
        return b == '"' ? start_key(f) : Step::kReject;
      case kObjColon: {
        if (b != ':') return Step::kReject;
        const int32_t value_node = f.count >= 0 ? n.key_nodes[f.count] : n.additional;
        f.phase = kObjInValue;
        f.whitespace = 0;
        push_value(value_node);
        return Step::kTaken;
      }
      case kObjNext:
        if (b == ',' && key_may_start(f)) {
          f.phase = kObjKeyDue;
          f.whitespace = 0;
          return Step::kTaken;
        }
        if (b == '}' && can_close) return end_value(), Step::kTaken;
        return Step::kReject;
      default: return Step::kReject;  // a key or value frame is above: it takes the bytes
    }
  }

  Step array(Frame& f, unsigned char b) {
    const Node& n = nodes_[f.node];
    if (is_ws(b) && f.phase != kArrInValue) return take_ws(f) ? Step::kTaken : Step::kReject;
    switch (f.phase) {
      case kArrOpen:
        if (b == ']') return n.min_items == 0 ? (end_value(), Step::kTaken) : Step::kReject;
        [[fallthrough]];
      case kArrItemDue:
        if (n.max_items >= 0 && f.count >= n.max_items) return Step::kReject;
        f.phase = kArrInValue;
        f.whitespace = 0;
        push_value(n.items);
        return Step::kRefeed;  // the new value frame takes b
      case kArrNext:
        if (b == ',' && (n.max_items < 0 || f.count < n.max_items)) {
          f.phase = kArrItemDue;
          f.whitespace = 0;
          return Step::kTaken;
        }
        if (b == ']' && f.count >= n.min_items) return end_value(), Step::kTaken;
        return Step::kReject;
      default: return Step::kReject;
    }
  }

  // Strings and property names: JSON string syntax (escapes, UTF-8 checked byte by byte); a
  // name also narrows the sorted property names still possible.
  Step string(Frame& f, unsigned char b) {
    if (f.utf8_left > 0) {
      if (b < f.utf8_lo || b > f.utf8_hi) return Step::kReject;
      f.utf8_lo = 0x80;
      f.utf8_hi = 0xBF;
      if (--f.utf8_left == 0) ++f.count;
      return narrow_key(f, b);
    }
    if (f.escape == 1) {
      if (b == 'u') {
        f.escape = 2;
      } else if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        f.escape = 0;
        ++f.count;
      } else {
        return Step::kReject;
      }
      return narrow_key(f, b);
    }
    if (f.escape >= 2) {
      if (!is_hex(b)) return Step::kReject;
      if (++f.escape == 6) {
        f.escape = 0;
        ++f.count;
      }
      return narrow_key(f, b);
    }
    if (b == '"') return close_string(f);
    const int32_t max_length = f.kind == Frame::kString ? nodes_[f.node].max_length : -1;
    if (max_length >= 0 && f.count >= max_length) return Step::kReject;
    if (b < 0x20) return Step::kReject;  // control characters must be escaped
    if (b == '\\') {
      f.escape = 1;
    } else if (b < 0x80) {
      ++f.count;
    } else if (b >= 0xC2 && b <= 0xDF) {
      f.utf8_left = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      f.utf8_left = 2;
      if (b == 0xE0) f.utf8_lo = 0xA0;  // no overlong forms
      if (b == 0xED) f.utf8_hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      f.utf8_left = 3;
      if (b == 0xF0) f.utf8_lo = 0x90;
      if (b == 0xF4) f.utf8_hi = 0x8F;  // nothing past U+10FFFF
    } else {
      return Step::kReject;
    }
    return narrow_key(f, b);
  }

  Step narrow_key(Frame& f, unsigned char b) {
    if (f.kind != Frame::kKey) return Step::kTaken;
    const Node& n = nodes_[f.node];
    int32_t lo = f.lo, hi = f.lo;
    for (int32_t k = f.lo; k < f.hi; ++k) {
      const std::string& key = n.keys[k];
      const bool match = static_cast<int32_t>(key.size()) > f.pos && static_cast<unsigned char>(key[f.pos]) == b;
      if (match && hi == lo) lo = k;
      if (match) hi = k + 1;
    }
    if (hi == lo) lo = hi = 0;
    const bool open_names = n.additional != JsonGrammar::kNone;
    if (!open_names) {
      bool unused = false;
      for (int32_t k = lo; k < hi && !unused; ++k) unused = !(f.used >> k & 1);
      if (!unused) return Step::kReject;
    }
    f.lo = lo;
    f.hi = hi;
    ++f.pos;
    return Step::kTaken;
  }

  Step close_string(Frame& f) {
    if (f.kind == Frame::kString) {
      if (f.count < nodes_[f.node].min_length) return Step::kReject;
      end_value();
      return Step::kTaken;
    }
    // A property name: a declared one not given yet, or (where allowed) any other.
    const Node& n = nodes_[f.node];
    const bool exact = f.lo < f.hi && static_cast<int32_t>(n.keys[f.lo].size()) == f.pos;
    int32_t key = -1;
    if (exact) {
      if (f.used >> f.lo & 1) return Step::kReject;  // no property twice
      key = f.lo;
    } else if (n.additional == JsonGrammar::kNone) {
      return Step::kReject;
    }
    st_.pop_back();
    Frame& object = st_.back();
    object.count = key;
    if (key >= 0) object.used |= uint64_t{1} << key;
    object.phase = kObjColon;
    object.whitespace = 0;
    return Step::kTaken;
  }

  Step number(Frame& f, unsigned char b) {
    const bool integer = nodes_[f.node].kind == Kind::kInteger;
    const bool digit = is_digit(b);
    auto go = [&](NumberPhase p) {
      f.phase = p;
      return Step::kTaken;
    };
    auto end = [&] {
      if (!number_can_end(f)) return Step::kReject;
      end_value();
      return Step::kRefeed;
    };
    switch (f.phase) {
      case kNumStart:
        if (b == '-') return go(kNumMinus);
        [[fallthrough]];
      case kNumMinus:
        if (b == '0') return go(kNumZero);
        return digit ? go(kNumInt) : Step::kReject;
      case kNumZero:
      case kNumInt:
        if (digit) return f.phase == kNumInt ? go(kNumInt) : Step::kReject;  // no leading zeros
        if (!integer && b == '.') return go(kNumDot);
        if (!integer && (b == 'e' || b == 'E')) return go(kNumE);
        return end();
      case kNumDot: return digit ? go(kNumFrac) : Step::kReject;
      case kNumFrac:
        if (digit) return go(kNumFrac);
        if (b == 'e' || b == 'E') return go(kNumE);
        return end();
      case kNumE:
        if (b == '+' || b == '-') return go(kNumESign);
        [[fallthrough]];
      case kNumESign: return digit ? go(kNumExp) : Step::kReject;
      case kNumExp: return digit ? go(kNumExp) : end();
    }
    return Step::kReject;
  }

  // enum / const / true / false / null: the sorted texts that still match share the first `pos`
  // bytes, so they are a range [lo, hi), its shortest first.
  Step literal(Frame& f, unsigned char b) {
    const Node& n = nodes_[f.node];
    int32_t lo = f.lo, hi = f.lo;
    for (int32_t k = f.lo; k < f.hi; ++k) {
      const std::string& text = n.literals[k];
      const bool match = static_cast<int32_t>(text.size()) > f.pos && static_cast<unsigned char>(text[f.pos]) == b;
      if (match && hi == lo) lo = k;
      if (match) hi = k + 1;
    }
    if (hi == lo) {
      if (!literal_can_end(f, n)) return Step::kReject;
      end_value();
      return Step::kRefeed;
    }
    f.lo = lo;
    f.hi = hi;
    ++f.pos;
    // Whole, and no longer text goes on from here: the value is over now.
    if (hi - lo == 1 && literal_can_end(f, n)) end_value();
    return Step::kTaken;
  }

  const std::vector<Node>& nodes_;
  std::vector<Frame>& st_;
};

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar) : grammar_(std::move(grammar)) {
  Frame root;
  root.kind = Frame::kValue;
  root.node = grammar_->root();
  stack_.push_back(root);
}

bool JsonMatcher::feed(std::vector<Frame>& stack, unsigned char byte) const {
  return Walk(*grammar_, stack).feed(byte);
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  scratch_ = stack_;
  for (unsigned char b : bytes) {
    if (!feed(scratch_, b)) return false;
  }
  return true;
}

bool JsonMatcher::advance(std::string_view bytes) {
  if (!accepts(bytes)) return false;
  std::swap(stack_, scratch_);
  return true;
}

bool JsonMatcher::complete() const {
  if (stack_.empty()) return true;
  if (stack_.size() > 1) return false;
  const Frame& f = stack_.back();  // a top-level number or literal may still be open
  if (f.kind == Frame::kNumber) return number_can_end(f);
  if (f.kind == Frame::kLiteral) return literal_can_end(f, grammar_->nodes()[f.node]);
  return false;
}

JsonChoice::JsonChoice(const std::vector<std::shared_ptr<const JsonGrammar>>& grammars) {
  for (const auto& g : grammars) alive_.emplace_back(g);
}

bool JsonChoice::accepts(std::string_view bytes) const {
  return std::any_of(alive_.begin(), alive_.end(), [&](const JsonMatcher& m) { return m.accepts(bytes); });
}

bool JsonChoice::advance(std::string_view bytes) {
  std::vector<JsonMatcher> taken;
  for (JsonMatcher& m : alive_) {
    if (m.advance(bytes)) taken.push_back(std::move(m));
  }
  if (taken.empty()) return false;  // advance() left each one as it was
  alive_ = std::move(taken);
  return true;
}

bool JsonChoice::complete() const {
  return std::any_of(alive_.begin(), alive_.end(), [](const JsonMatcher& m) { return m.complete(); });
}

bool JsonChoice::closed() const {
  return std::all_of(alive_.begin(), alive_.end(), [](const JsonMatcher& m) { return m.closed(); });
}

}  // namespace helios
