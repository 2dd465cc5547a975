#include <cassert>

#include "helios/kv_cache.h"

namespace helios {

BlockAllocator::BlockAllocator(int32_t n_blocks) : in_use_(n_blocks, 0) {
  free_list_.reserve(n_blocks);
  // Hand out low ids first: the stack pops from the back.
  for (int32_t id = n_blocks - 1; id >= 0; --id) free_list_.push_back(id);
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const int32_t id = free_list_.back();
  free_list_.pop_back();
  assert(!in_use_[id]);
  in_use_[id] = 1;
  return id;
}

void BlockAllocator::release(int32_t block_id) {
  assert(in_use_.at(block_id) && "release of a free block");
  in_use_[block_id] = 0;
  free_list_.push_back(block_id);
}

void BlockAllocator::grow(int32_t n_blocks) {
  const int32_t before = this->n_blocks();
  if (n_blocks <= before) return;
  in_use_.resize(n_blocks, 0);
  // At the bottom of the stack: the blocks freed most recently are still reused first.
  std::vector<int32_t> added;
  for (int32_t id = n_blocks - 1; id >= before; --id) added.push_back(id);
  free_list_.insert(free_list_.begin(), added.begin(), added.end());
}

bool reserve_tokens(BlockAllocator& allocator, BlockTable& table, int32_t n_tokens,
                    int32_t block_size) {
  const int32_t needed = blocks_for_tokens(n_tokens, block_size) -
                         static_cast<int32_t>(table.block_ids.size());
  if (needed <= 0) return true;
  if (!allocator.can_allocate(needed)) return false;
  for (int32_t i = 0; i < needed; ++i) table.block_ids.push_back(*allocator.allocate());
  return true;
}

void release_table(BlockAllocator& allocator, BlockTable& table) {
  for (int32_t id : table.block_ids) allocator.release(id);
  table.block_ids.clear();
}

}  // namespace helios
