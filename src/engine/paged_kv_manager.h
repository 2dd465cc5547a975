// The engine's KvManager: device block tables per request over a CachingBlockPool (blocks shared
// by reference count, full prefix blocks content-addressed), and host swap space with its own
// allocator. Bookkeeping only; the engine copies the data.
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "helios/kv_cache.h"
#include "helios/prefix_cache.h"
#include "helios/scheduler.h"

namespace helios {

class PagedKvManager final : public KvManager {
 public:
  PagedKvManager(int32_t n_blocks, int32_t block_size, int32_t n_swap_blocks, bool prefix_caching = false)
      : device_(n_blocks, block_size, prefix_caching), host_(n_swap_blocks), block_size_(block_size) {}

  int32_t block_size() const override { return block_size_; }
  int32_t n_free_blocks() const override { return device_.n_free(); }
  int32_t n_blocks() const override { return device_.n_blocks(); }
  bool reserve(RequestId id, int32_t n_tokens) override;
  void release(RequestId id) override;
  bool swap_out(RequestId id, std::vector<BlockCopy>* copies) override;
  bool swap_in(RequestId id, std::vector<BlockCopy>* copies) override;
  int32_t swap_out_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) override;
  int32_t swap_in_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) override;
  void finish_async_copies() override;
  int32_t n_device_blocks(RequestId id) const override;
  int32_t n_host_blocks(RequestId id) const override;
  int32_t n_free_host_blocks() const override { return host_.n_free(); }
  int32_t attach_cached_prefix(RequestId id, const std::vector<TokenId>& tokens, int32_t max_tokens) override;

  // After a step: the request's KV is valid for tokens [0, n_valid); its full blocks from the
  // first unpublished one are published while `full_depth(position)` holds for all their tokens
  // (the first that does not stops the chain: later keys would hang off it).
  void publish_blocks(RequestId id, const std::vector<TokenId>& tokens, int32_t n_valid,
                      const std::function<bool(int32_t position)>& full_depth);
  PrefixCacheStats prefix_cache_stats() const { return device_.stats(); }

  const BlockTable* table(RequestId id) const;  // device blocks; nullptr when none
  int32_t n_used_blocks() const { return device_.n_used(); }
  // More device blocks (the storage has grown to n_blocks): free, after those free now.
  void grow_device(int32_t n_blocks) { device_.grow(n_blocks); }
  // A fresh device pool of n_blocks, cache emptied, for storage created anew (a deeper model's
  // K/V, in a pool of another size). Precondition: no request holds a device block.
  void reset_device(int32_t n_blocks);

 private:
  // The keys of a request's published (or attached) blocks, its first blocks in order.
  std::vector<uint64_t>& chain(RequestId id) { return chains_[id]; }
  // The request's chain no longer covers blocks past its first n device blocks.
  void truncate_chain(RequestId id, size_t n);

  CachingBlockPool device_;
  BlockAllocator host_;
  int32_t block_size_;
  std::unordered_map<RequestId, BlockTable> device_tables_;
  std::unordered_map<RequestId, BlockTable> host_tables_;
  std::unordered_map<RequestId, std::vector<uint64_t>> chains_;
  // Blocks given up by this step's async copies: free once the copies are done.
  std::vector<int32_t> device_freed_after_copies_, host_freed_after_copies_;
};

}  // namespace helios
