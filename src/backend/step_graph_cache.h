// Which recorded steps a backend replays (CUDA graphs). A step is known by its key: the bytes of
// every argument of every launch it makes, so two steps with one key make the same launches and
// a graph captured from one is the other's. A key seen once is run op by op (a one-off step is not
// worth capturing); seen again, it is captured; captured, it is replayed while it keeps coming.
// The graphs are opaque here (the backend's handles); the least recently used one goes when the
// cache is full. Device-free, so its decisions are tested on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace helios {

class StepGraphCache {
 public:
  explicit StepGraphCache(size_t capacity) : capacity_(capacity) {}

  enum class Action { kRun, kCapture, kReplay };
  struct Decision {
    Action action = Action::kRun;
    void* graph = nullptr;  // kReplay: the graph to launch
  };
  Decision decide(const std::string& key);
  // The graph captured for `key`; returns the graph it pushed out (least recently used) for the
  // caller to destroy, or null.
  void* store(const std::string& key, void* graph);
  // Every graph, for the caller to destroy; the cache is empty after.
  std::vector<void*> clear();
  size_t size() const { return graphs_.size(); }

 private:
  struct Entry {
    void* graph = nullptr;
    uint64_t used = 0;  // clock_ at the last decide() that chose it
  };
  static constexpr size_t kMaxSeen = 4096;  // keys seen once, remembered by hash

  size_t capacity_;
  uint64_t clock_ = 0;
  std::unordered_map<std::string, Entry> graphs_;
  std::unordered_set<size_t> seen_;
};

}  // namespace helios
