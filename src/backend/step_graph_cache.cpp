#include "backend/step_graph_cache.h"

#include <functional>

namespace helios {

StepGraphCache::Decision StepGraphCache::decide(const std::string& key) {
  ++clock_;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second.used = clock_;
    return {Action::kReplay, it->second.graph};
  }
  if (capacity_ == 0) return {};
  const size_t h = std::hash<std::string>{}(key);
  if (seen_.count(h)) return {Action::kCapture, nullptr};  // a hash collision costs one capture, no more
  if (seen_.size() >= kMaxSeen) seen_.clear();
  seen_.insert(h);
  return {};
}

void* StepGraphCache::store(const std::string& key, void* graph) {
  seen_.erase(std::hash<std::string>{}(key));
  void* evicted = nullptr;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    evicted = it->second.graph;
    graphs_.erase(it);
  } else if (graphs_.size() >= capacity_) {
    auto oldest = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (it->second.used < oldest->second.used) oldest = it;
    }
    evicted = oldest->second.graph;
    graphs_.erase(oldest);
  }
  graphs_.emplace(key, Entry{graph, clock_});
  return evicted;
}

std::vector<void*> StepGraphCache::clear() {
  std::vector<void*> out;
  for (auto& [key, e] : graphs_) out.push_back(e.graph);
  graphs_.clear();
  seen_.clear();
  return out;
}

}  // namespace helios
