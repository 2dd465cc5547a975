#include "engine/paged_kv_manager.h"

#include <cassert>

namespace helios {

bool PagedKvManager::reserve(RequestId id, int32_t n_tokens) {
  BlockTable& table = device_tables_[id];
  const int32_t needed = blocks_for_tokens(n_tokens, block_size_) - static_cast<int32_t>(table.block_ids.size());
  if (needed <= 0) return true;
  if (device_.n_free() < needed) {
    if (table.block_ids.empty()) device_tables_.erase(id);
    return false;
  }
  for (int32_t i = 0; i < needed; ++i) table.block_ids.push_back(*device_.allocate());
  return true;
}

void PagedKvManager::release(RequestId id) {
  if (auto it = device_tables_.find(id); it != device_tables_.end()) {
    for (int32_t b : it->second.block_ids) device_.release(b);
    device_tables_.erase(it);
  }
  if (auto it = host_tables_.find(id); it != host_tables_.end()) {
    release_table(host_, it->second);
    host_tables_.erase(it);
  }
  chains_.erase(id);
}

bool PagedKvManager::swap_out(RequestId id, std::vector<BlockCopy>* copies) {
  auto it = device_tables_.find(id);
  if (it == device_tables_.end()) return true;  // nothing cached yet
  std::vector<int32_t>& device = it->second.block_ids;
  if (!host_.can_allocate(static_cast<int32_t>(device.size()))) return false;
  BlockTable& host = host_tables_[id];
  for (int32_t src : device) {
    const int32_t dst = *host_.allocate();
    host.block_ids.push_back(dst);
    copies->push_back({src, dst});
    device_.release(src);  // the copy runs before the step, before anyone writes the block
  }
  device_tables_.erase(it);
  truncate_chain(id, 0);
  return true;
}

bool PagedKvManager::swap_in(RequestId id, std::vector<BlockCopy>* copies) {
  auto it = host_tables_.find(id);
  if (it == host_tables_.end()) return true;
  std::vector<int32_t>& host = it->second.block_ids;
  if (device_.n_free() < static_cast<int32_t>(host.size())) return false;
  BlockTable& device = device_tables_[id];
  for (int32_t src : host) {
    const int32_t dst = *device_.allocate();
    device.block_ids.push_back(dst);
    copies->push_back({src, dst});
  }
  release_table(host_, it->second);
  host_tables_.erase(it);
  return true;
}

int32_t PagedKvManager::swap_out_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) {
  auto it = device_tables_.find(id);
  if (it == device_tables_.end()) return 0;
  std::vector<int32_t>& device = it->second.block_ids;
  std::vector<int32_t>& host = host_tables_[id].block_ids;
  int32_t moved = 0;
  // The last device blocks go first, to the front of the host ones: device then host stays in
  // position order.
  while (moved < n && !device.empty() && host_.n_free() > 0) {
    const int32_t dst = *host_.allocate();
    copies->push_back({device.back(), dst});
    device_freed_after_copies_.push_back(device.back());
    device.pop_back();
    host.insert(host.begin(), dst);
    ++moved;
  }
  truncate_chain(id, device.size());
  if (device.empty()) device_tables_.erase(it);
  if (host.empty()) host_tables_.erase(id);
  return moved;
}

int32_t PagedKvManager::swap_in_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) {
  auto it = host_tables_.find(id);
  if (it == host_tables_.end()) return 0;
  std::vector<int32_t>& host = it->second.block_ids;
  int32_t moved = 0;
  while (moved < n && !host.empty() && device_.n_free() > 0) {
    const int32_t dst = *device_.allocate();
    copies->push_back({host.front(), dst});
    host_freed_after_copies_.push_back(host.front());
    host.erase(host.begin());
    device_tables_[id].block_ids.push_back(dst);
    ++moved;
  }
  if (host.empty()) host_tables_.erase(it);
  return moved;
}

void PagedKvManager::finish_async_copies() {
  for (int32_t b : device_freed_after_copies_) device_.release(b);
  for (int32_t b : host_freed_after_copies_) host_.release(b);
  device_freed_after_copies_.clear();
  host_freed_after_copies_.clear();
}

int32_t PagedKvManager::attach_cached_prefix(RequestId id, const std::vector<TokenId>& tokens, int32_t max_tokens) {
  if (!device_.caching() || device_tables_.count(id) || host_tables_.count(id)) return 0;
  const int32_t n_query = std::min<int32_t>(max_tokens, static_cast<int32_t>(tokens.size())) / block_size_;
  if (n_query <= 0) return 0;
  std::vector<uint64_t>& keys = chain(id);
  keys.clear();
  BlockTable table;
  uint64_t parent = 0;
  for (int32_t i = 0; i < n_query; ++i) {
    const TokenId* block_tokens = tokens.data() + static_cast<size_t>(i) * block_size_;
    const uint64_t key = prefix_block_key(parent, block_tokens, block_size_);
    const auto block = device_.lookup(key, block_tokens);
    if (!block) break;
    table.block_ids.push_back(*block);
    keys.push_back(key);
    parent = key;
  }
  device_.count_query(n_query, static_cast<int32_t>(table.block_ids.size()));
  if (table.block_ids.empty()) {
    chains_.erase(id);
    return 0;
  }
  const auto n_hit = static_cast<int32_t>(table.block_ids.size());
  device_tables_[id] = std::move(table);
  return n_hit * block_size_;
}

void PagedKvManager::publish_blocks(RequestId id, const std::vector<TokenId>& tokens, int32_t n_valid,
                                    const std::function<bool(int32_t position)>& full_depth) {
  if (!device_.caching()) return;
  auto it = device_tables_.find(id);
  if (it == device_tables_.end() || host_tables_.count(id)) return;  // partly on host: not now
  const std::vector<int32_t>& blocks = it->second.block_ids;
  std::vector<uint64_t>& keys = chain(id);
  const int32_t n_full = std::min<int32_t>(n_valid / block_size_, static_cast<int32_t>(blocks.size()));
  for (auto i = static_cast<int32_t>(keys.size()); i < n_full; ++i) {
    for (int32_t p = i * block_size_; p < (i + 1) * block_size_; ++p) {
      if (!full_depth(p)) return;
    }
    const TokenId* block_tokens = tokens.data() + static_cast<size_t>(i) * block_size_;
    const uint64_t key = prefix_block_key(keys.empty() ? 0 : keys.back(), block_tokens, block_size_);
    device_.publish(blocks[i], key, block_tokens);
    keys.push_back(key);
  }
}

void PagedKvManager::truncate_chain(RequestId id, size_t n) {
  auto it = chains_.find(id);
  if (it != chains_.end() && it->second.size() > n) it->second.resize(n);
}

int32_t PagedKvManager::n_device_blocks(RequestId id) const {
  auto it = device_tables_.find(id);
  return it == device_tables_.end() ? 0 : static_cast<int32_t>(it->second.block_ids.size());
}

int32_t PagedKvManager::n_host_blocks(RequestId id) const {
  auto it = host_tables_.find(id);
  return it == host_tables_.end() ? 0 : static_cast<int32_t>(it->second.block_ids.size());
}

void PagedKvManager::reset_device(int32_t n_blocks) {
  assert(device_.n_used() == 0 && "reset_device with device blocks in use");
  device_.reset(n_blocks);
  device_tables_.clear();  // only empty tables can be left (reserve() of nothing, say)
  chains_.clear();
}

const BlockTable* PagedKvManager::table(RequestId id) const {
  auto it = device_tables_.find(id);
  return it == device_tables_.end() ? nullptr : &it->second;
}

}  // namespace helios
