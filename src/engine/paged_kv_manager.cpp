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
