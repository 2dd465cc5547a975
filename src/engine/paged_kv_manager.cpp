#include "engine/paged_kv_manager.h"

#include <cassert>

namespace helios {

bool PagedKvManager::reserve(RequestId id, int32_t n_tokens) {
  return reserve_tokens(device_, device_tables_[id], n_tokens, block_size_);
}

void PagedKvManager::release(RequestId id) {
  if (auto it = device_tables_.find(id); it != device_tables_.end()) {
    release_table(device_, it->second);
    device_tables_.erase(it);
  }
  if (auto it = host_tables_.find(id); it != host_tables_.end()) {
    release_table(host_, it->second);
    host_tables_.erase(it);
  }
}

// Moves `from`'s blocks into newly allocated blocks of `to`, recording the copies.
static bool move_blocks(BlockAllocator& from_alloc, BlockTable& from, BlockAllocator& to_alloc,
                        BlockTable& to, std::vector<BlockCopy>* copies) {
  const auto n = static_cast<int32_t>(from.block_ids.size());
  if (!to_alloc.can_allocate(n)) return false;
  for (int32_t src : from.block_ids) {
    const int32_t dst = *to_alloc.allocate();
    to.block_ids.push_back(dst);
    copies->push_back({src, dst});
  }
  release_table(from_alloc, from);
  return true;
}

bool PagedKvManager::swap_out(RequestId id, std::vector<BlockCopy>* copies) {
  auto it = device_tables_.find(id);
  if (it == device_tables_.end()) return true;  // nothing cached yet
  if (!move_blocks(device_, it->second, host_, host_tables_[id], copies)) return false;
  device_tables_.erase(it);
  return true;
}

bool PagedKvManager::swap_in(RequestId id, std::vector<BlockCopy>* copies) {
  auto it = host_tables_.find(id);
  if (it == host_tables_.end()) return true;
  if (!move_blocks(host_, it->second, device_, device_tables_[id], copies)) return false;
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
  device_ = BlockAllocator(n_blocks);
  device_tables_.clear();  // only empty tables can be left (reserve() of nothing, say)
}

const BlockTable* PagedKvManager::table(RequestId id) const {
  auto it = device_tables_.find(id);
  return it == device_tables_.end() ? nullptr : &it->second;
}

}  // namespace helios
