// A KvManager for scheduler tests: real block bookkeeping (device and host free lists, per-request
// block lists), no storage. It records every call so tests can check what the scheduler asked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "helios/scheduler.h"

namespace helios::testing {

class FakeKvManager : public KvManager {
 public:
  FakeKvManager(int32_t n_device_blocks, int32_t block_size, int32_t n_host_blocks = 0)
      : n_device_blocks_(n_device_blocks), n_host_blocks_(n_host_blocks), block_size_(block_size) {
    for (int32_t b = n_device_blocks - 1; b >= 0; --b) free_device_.push_back(b);
    for (int32_t b = n_host_blocks - 1; b >= 0; --b) free_host_.push_back(b);
  }

  int32_t block_size() const override { return block_size_; }
  int32_t n_free_blocks() const override { return static_cast<int32_t>(free_device_.size()); }
  int32_t n_blocks() const override { return n_device_blocks_; }

  bool reserve(RequestId id, int32_t n_tokens) override {
    calls.push_back("reserve " + std::to_string(id) + " " + std::to_string(n_tokens));
    std::vector<int32_t>& blocks = device_[id];
    const int32_t n_needed = (n_tokens + block_size_ - 1) / block_size_;
    const int32_t n_more = n_needed - static_cast<int32_t>(blocks.size());
    if (n_more > n_free_blocks()) {
      if (blocks.empty()) device_.erase(id);
      ++n_failed_reserves;
      return false;
    }
    for (int32_t i = 0; i < n_more; ++i) blocks.push_back(take(free_device_));
    reserved_tokens_[id] = std::max(reserved_tokens_[id], n_tokens);
    return true;
  }

  void release(RequestId id) override {
    calls.push_back("release " + std::to_string(id));
    give_back(device_, free_device_, id);
    give_back(host_, free_host_, id);
    reserved_tokens_.erase(id);
  }

  bool swap_out(RequestId id, std::vector<BlockCopy>* copies) override {
    calls.push_back("swap_out " + std::to_string(id));
    return move_blocks(id, device_, free_device_, host_, free_host_, copies);
  }

  bool swap_in(RequestId id, std::vector<BlockCopy>* copies) override {
    calls.push_back("swap_in " + std::to_string(id));
    return move_blocks(id, host_, free_host_, device_, free_device_, copies);
  }

  int32_t swap_out_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) override {
    calls.push_back("swap_out_blocks " + std::to_string(id) + " " + std::to_string(n));
    std::vector<int32_t>& device = device_[id];
    std::vector<int32_t>& host = host_[id];
    int32_t moved = 0;
    while (moved < n && !device.empty() && !free_host_.empty()) {
      const int32_t dst = take(free_host_);
      copies->push_back({device.back(), dst});
      pending_device_.push_back(device.back());
      device.pop_back();
      host.insert(host.begin(), dst);
      ++moved;
    }
    if (device.empty()) device_.erase(id);
    if (host.empty()) host_.erase(id);
    return moved;
  }

  int32_t swap_in_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) override {
    calls.push_back("swap_in_blocks " + std::to_string(id) + " " + std::to_string(n));
    std::vector<int32_t>& host = host_[id];
    int32_t moved = 0;
    while (moved < n && !host.empty() && !free_device_.empty()) {
      const int32_t dst = take(free_device_);
      copies->push_back({host.front(), dst});
      pending_host_.push_back(host.front());
      host.erase(host.begin());
      device_[id].push_back(dst);
      ++moved;
    }
    if (host.empty()) host_.erase(id);
    return moved;
  }

  void finish_async_copies() override {
    free_device_.insert(free_device_.end(), pending_device_.begin(), pending_device_.end());
    free_host_.insert(free_host_.end(), pending_host_.begin(), pending_host_.end());
    pending_device_.clear();
    pending_host_.clear();
  }

  int32_t n_device_blocks(RequestId id) const override { return count(device_, id); }
  int32_t n_host_blocks(RequestId id) const override { return count(host_, id); }
  int32_t n_free_host_blocks() const override { return static_cast<int32_t>(free_host_.size()); }

  // ---- For tests ----
  // Blocks held by anyone: zero once every request is finished or aborted.
  int32_t n_used_blocks() const {
    return n_device_blocks_ - n_free_blocks() + n_host_blocks_ - n_free_host_blocks();
  }
  // Largest token count reserved for id while it holds device blocks (0 once released).
  int32_t reserved_tokens(RequestId id) const {
    auto it = reserved_tokens_.find(id);
    return it == reserved_tokens_.end() || count(device_, id) == 0 ? 0 : it->second;
  }
  bool called(const std::string& call) const {
    return std::find(calls.begin(), calls.end(), call) != calls.end();
  }

  std::vector<std::string> calls;  // "reserve 3 17", "release 3", "swap_out 3", "swap_in 3"
  int32_t n_failed_reserves = 0;

 private:
  using BlockMap = std::map<RequestId, std::vector<int32_t>>;

  static int32_t take(std::vector<int32_t>& free) {
    const int32_t b = free.back();
    free.pop_back();
    return b;
  }
  static void give_back(BlockMap& map, std::vector<int32_t>& free, RequestId id) {
    auto it = map.find(id);
    if (it == map.end()) return;
    free.insert(free.end(), it->second.begin(), it->second.end());
    map.erase(it);
  }
  static int32_t count(const BlockMap& map, RequestId id) {
    auto it = map.find(id);
    return it == map.end() ? 0 : static_cast<int32_t>(it->second.size());
  }
  // All of id's blocks from one pool to the other; false (no change) when `to` has too few free.
  static bool move_blocks(RequestId id, BlockMap& from, std::vector<int32_t>& from_free, BlockMap& to,
                          std::vector<int32_t>& to_free, std::vector<BlockCopy>* copies) {
    auto it = from.find(id);
    const size_t n = it == from.end() ? 0 : it->second.size();
    if (n > to_free.size()) return false;
    std::vector<int32_t>& dst = to[id];
    for (size_t i = 0; i < n; ++i) {
      const int32_t to_block = take(to_free);
      copies->push_back({it->second[i], to_block});
      dst.push_back(to_block);
    }
    if (it != from.end()) give_back(from, from_free, id);
    return true;
  }

  int32_t n_device_blocks_;
  int32_t n_host_blocks_;
  int32_t block_size_;
  std::vector<int32_t> free_device_;
  std::vector<int32_t> free_host_;
  std::vector<int32_t> pending_device_, pending_host_;  // freed once the async copies are done
  BlockMap device_;
  BlockMap host_;
  std::map<RequestId, int32_t> reserved_tokens_;
};

}  // namespace helios::testing
