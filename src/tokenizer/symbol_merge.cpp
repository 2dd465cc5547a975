#include "tokenizer/symbol_merge.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <queue>

#include "tokenizer/unicode.h"

namespace helios {

namespace {

// Bytes [start, start + length) of the text being merged, in a linked list; a symbol merged
// into its left neighbour keeps length 0.
struct Symbol {
  size_t start;
  size_t length;
  int prev;
  int next;
};

struct Bigram {
  int left;
  int right;
  double priority;
  size_t length;  // left + right when queued; differs once either side has changed
};

// Top of the queue: highest priority, then leftmost.
struct BigramBelow {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
  }
};

using Queue = std::priority_queue<Bigram, std::vector<Bigram>, BigramBelow>;

std::vector<Symbol> split_chars(std::string_view text) {
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length =
        std::min(unicode::sequence_length(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({pos, length, index - 1, pos + length < text.size() ? index + 1 : -1});
    pos += length;
  }
  return symbols;
}

void push_bigram(std::string_view text, const std::vector<Symbol>& symbols, int left, int right,
                 const MergePriority& priority, Queue* queue) {
  if (left < 0 || right < 0) return;
  const Symbol& l = symbols[left];
  const Symbol& r = symbols[right];
  const std::optional<double> p =
      priority(text.substr(l.start, l.length), text.substr(r.start, r.length));
  if (p) queue->push({left, right, *p, l.length + r.length});
}

}  // namespace

std::vector<std::string_view> merge_symbols(std::string_view text, const MergePriority& priority) {
  std::vector<Symbol> symbols = split_chars(text);
  Queue queue;
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) {
    push_bigram(text, symbols, i - 1, i, priority, &queue);
  }
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;  // stale: a side was merged away or grew since this pair was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    push_bigram(text, symbols, left.prev, bigram.left, priority, &queue);
    push_bigram(text, symbols, bigram.left, left.next, priority, &queue);
  }
  std::vector<std::string_view> out;
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    out.push_back(text.substr(symbols[i].start, symbols[i].length));
  }
  return out;
}

}  // namespace helios
