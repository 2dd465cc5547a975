// The paged KV cache. Bookkeeping (which blocks are free, who holds them) is host-only and
// testable anywhere; the storage itself is backend memory owned by KvCacheStorage.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "helios/backend.h"
#include "helios/model_config.h"
#include "helios/status.h"

namespace helios {

// Fixed-size blocks, each held by one sequence at a time: a block returns to the free list when
// its holder releases it.
class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t n_blocks);

  int32_t n_blocks() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t n_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t n_used() const { return n_blocks() - n_free(); }
  bool can_allocate(int32_t n) const { return n <= n_free(); }

  // A free block, now in use, or nullopt when none is free (a normal outcome, not an error).
  std::optional<int32_t> allocate();
  void release(int32_t block_id);  // back to the free list
  // Blocks [n_blocks(), n_blocks) join the free list, handed out after the blocks free now (lowest
  // id first, as a new allocator of that size would). A no-op when n_blocks is not larger.
  void grow(int32_t n_blocks);

 private:
  std::vector<int32_t> free_list_;  // block ids, most recently freed last (reused first)
  std::vector<uint8_t> in_use_;     // [n_blocks] 1 while handed out
};

// The blocks that hold one sequence's KV, in position order: position p lives in block
// block_ids[p / block_size] at offset p % block_size.
struct BlockTable {
  std::vector<int32_t> block_ids;

  int32_t capacity_tokens(int32_t block_size) const {
    return static_cast<int32_t>(block_ids.size()) * block_size;
  }
  // The cache slot of a position: block_id * block_size + offset.
  int32_t slot(int32_t position, int32_t block_size) const {
    return block_ids[position / block_size] * block_size + position % block_size;
  }
};

// Blocks needed to hold n_tokens.
inline int32_t blocks_for_tokens(int32_t n_tokens, int32_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

// Grows `table` to hold n_tokens. When there are not enough free blocks, nothing changes and the
// result is false.
bool reserve_tokens(BlockAllocator& allocator, BlockTable& table, int32_t n_tokens,
                    int32_t block_size);
// Releases every block of `table` and empties it.
void release_table(BlockAllocator& allocator, BlockTable& table);

// K and V storage for every layer, in backend memory, as f32 (the reference) or f16.
class KvCacheStorage {
 public:
  // RESOURCE_EXHAUSTED naming the bytes when the backend cannot hold it; INVALID_ARGUMENT when the
  // backend does not take `type`.
  static StatusOr<KvCacheStorage> create(Backend& backend, const ModelConfig& config,
                                         int32_t n_blocks, int32_t block_size,
                                         kernels::KvType type = kernels::KvType::kF32);
  static int64_t bytes_per_block(const ModelConfig& config, int32_t block_size,
                                 kernels::KvType type = kernels::KvType::kF32);

  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  kernels::KvType type() const { return type_; }
  kernels::PagedKV layer(int32_t l) const;

  // One block's K and V of every layer as raw 4-byte words (f32 values, or pairs of f16), for
  // swapping to host memory and back: on the backend's copy stream (Backend::copy_to_host), done
  // on return, so a thread may copy blocks the forward pass in flight does not touch.
  int64_t words_per_block() const;
  void read_block(int32_t block_id, float* host_dst) const;
  void write_block(int32_t block_id, const float* host_src);

  // Grows the cache to n_blocks, keeping every existing block's contents; the new blocks hold
  // garbage until written. Every layer's K and V move to new buffers (views from layer() taken
  // before are stale), and while they are copied the old and the new storage are both held.
  // RESOURCE_EXHAUSTED naming the bytes when the backend cannot hold the new storage, or the
  // backend's error when a copy failed, and then the cache is as it was; INVALID_ARGUMENT for
  // fewer blocks than it has.
  Status grow(int32_t n_blocks);

  // A tensor-parallel model's cache holds one storage per rank, each with its KV heads: this one
  // is rank 0's, shard(r) rank r's (Model::create_kv). A block's words, swapping and growing
  // cover every rank's.
  void add_shard(KvCacheStorage other) { shards_.push_back(std::move(other)); }
  int32_t n_shards() const { return 1 + static_cast<int32_t>(shards_.size()); }
  KvCacheStorage& shard(int32_t rank) { return rank == 0 ? *this : shards_[static_cast<size_t>(rank) - 1]; }

 private:
  int64_t words_per_layer_block() const;

  Backend* backend_ = nullptr;
  int32_t n_blocks_ = 0;
  int32_t block_size_ = 0;
  int32_t n_kv_heads_ = 0;
  int32_t head_dim_ = 0;
  kernels::KvType type_ = kernels::KvType::kF32;
  std::vector<Buffer> k_, v_;  // per layer: [n_blocks, block_size, n_kv_heads, head_dim] of type_
  std::vector<KvCacheStorage> shards_;  // ranks 1.. of a tensor-parallel model
};

}  // namespace helios
