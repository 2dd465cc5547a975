// Automatic prefix caching: device KV blocks shared by reference count, and the full blocks of
// computed prefixes kept, content-addressed, after their last holder frees them, until blocks
// run out and the least recently used one is evicted. A block's key chains the key of the block
// before it with its own tokens, so equal keys mean equal prefixes (checked token for token).
//
// What a block's K/V depends on beyond its tokens — the model, its loaded depth, the KV type —
// is one per engine (a pool is reset when the depth changes). How the tokens were computed is
// the caller's part: only blocks whose every token ran the whole loaded stack are published (an
// early-exited token's K/V above its exit is filled from its exit state, which a fresh prompt
// would not compute), so a cached prefix is exactly what a new request would compute.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "helios/tokenizer.h"

namespace helios {

// The key of a full block: its parent's key (0 for the first block) and its tokens.
uint64_t prefix_block_key(uint64_t parent, const TokenId* tokens, int32_t n_tokens);

struct PrefixCacheStats {
  bool enabled = false;
  int32_t cached_blocks = 0;       // published blocks still held or kept
  int64_t query_tokens = 0;        // tokens of prefixes looked up (whole blocks)
  int64_t hit_tokens = 0;          // of those, found
  int64_t query_blocks = 0, hit_blocks = 0;
  int64_t evictions = 0;           // kept blocks reused for new ones
};

class CachingBlockPool {
 public:
  CachingBlockPool(int32_t n_blocks, int32_t block_size, bool caching);

  int32_t n_blocks() const { return static_cast<int32_t>(refs_.size()); }
  // Free blocks, counting kept cached ones (each can be evicted for a new holder).
  int32_t n_free() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  int32_t n_used() const { return n_blocks() - n_free(); }
  bool caching() const { return caching_; }

  // A block for a new holder (one reference): a free one, else the least recently used kept one,
  // evicted. nullopt when every block is held.
  std::optional<int32_t> allocate();
  // Drops one reference; at none, a published block is kept (evictable), any other is free.
  void release(int32_t block);
  // The published block with this key and these tokens, with a reference added; nullopt if none.
  std::optional<int32_t> lookup(uint64_t key, const TokenId* tokens);
  // The held block now holds the full prefix block `key` with `tokens`. A no-op when caching is
  // off, or another block already has the key.
  void publish(int32_t block, uint64_t key, const TokenId* tokens);
  // Blocks [n_blocks(), n) join as free. reset(): n fresh blocks, the cache emptied (a new KV
  // storage, or contents that no longer match their keys).
  void grow(int32_t n);
  void reset(int32_t n);

  PrefixCacheStats stats() const;
  void count_query(int32_t blocks, int32_t hits);

 private:
  void forget_key(int32_t block);

  int32_t block_size_;
  bool caching_;
  std::vector<int32_t> refs_;            // per block: holders
  std::vector<uint64_t> key_;            // per block: its key when published, else 0
  std::vector<TokenId> tokens_;          // [n_blocks, block_size]: a published block's tokens
  std::vector<int32_t> free_;            // unpublished free blocks, most recently freed last
  std::list<int32_t> lru_;               // kept published blocks, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  PrefixCacheStats stats_;
};

}  // namespace helios
