#include "helios/prefix_cache.h"

#include <algorithm>
#include <cassert>

namespace helios {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t prefix_block_key(uint64_t parent, const TokenId* tokens, int32_t n_tokens) {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ULL);
  for (int32_t i = 0; i < n_tokens; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
  return h == 0 ? 1 : h;  // 0 means "unpublished"
}

CachingBlockPool::CachingBlockPool(int32_t n_blocks, int32_t block_size, bool caching)
    : block_size_(block_size), caching_(caching) {
  reset(n_blocks);
}

void CachingBlockPool::reset(int32_t n) {
  refs_.assign(n, 0);
  key_.assign(n, 0);
  tokens_.assign(static_cast<size_t>(n) * block_size_, 0);
  free_.clear();
  for (int32_t b = n - 1; b >= 0; --b) free_.push_back(b);  // low ids first
  lru_.clear();
  lru_pos_.assign(n, lru_.end());
  in_lru_.assign(n, false);
  by_key_.clear();
}

void CachingBlockPool::grow(int32_t n) {
  const int32_t before = n_blocks();
  if (n <= before) return;
  refs_.resize(n, 0);
  key_.resize(n, 0);
  tokens_.resize(static_cast<size_t>(n) * block_size_, 0);
  lru_pos_.resize(n, lru_.end());
  in_lru_.resize(n, false);
  std::vector<int32_t> added;
  for (int32_t b = n - 1; b >= before; --b) added.push_back(b);
  free_.insert(free_.begin(), added.begin(), added.end());  // after the blocks free now
}

std::optional<int32_t> CachingBlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    in_lru_[b] = false;
    forget_key(b);
    ++stats_.evictions;
  } else {
    return std::nullopt;
  }
  refs_[b] = 1;
  return b;
}

void CachingBlockPool::release(int32_t block) {
  assert(refs_.at(block) > 0 && "release of a free block");
  if (--refs_[block] > 0) return;
  if (key_[block] != 0) {
    lru_pos_[block] = lru_.insert(lru_.end(), block);
    in_lru_[block] = true;
  } else {
    free_.push_back(block);
  }
}

std::optional<int32_t> CachingBlockPool::lookup(uint64_t key, const TokenId* tokens) {
  if (!caching_) return std::nullopt;
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  const int32_t b = it->second;
  if (!std::equal(tokens, tokens + block_size_, tokens_.begin() + static_cast<size_t>(b) * block_size_)) {
    return std::nullopt;  // a hash collision: not the same prefix
  }
  if (in_lru_[b]) {
    lru_.erase(lru_pos_[b]);
    in_lru_[b] = false;
  }
  ++refs_[b];
  return b;
}

void CachingBlockPool::publish(int32_t block, uint64_t key, const TokenId* tokens) {
  if (!caching_ || key_[block] != 0 || by_key_.count(key)) return;
  assert(refs_[block] > 0);
  key_[block] = key;
  std::copy(tokens, tokens + block_size_, tokens_.begin() + static_cast<size_t>(block) * block_size_);
  by_key_[key] = block;
}

void CachingBlockPool::forget_key(int32_t block) {
  if (key_[block] == 0) return;
  by_key_.erase(key_[block]);
  key_[block] = 0;
}

void CachingBlockPool::count_query(int32_t blocks, int32_t hits) {
  stats_.query_blocks += blocks;
  stats_.hit_blocks += hits;
  stats_.query_tokens += static_cast<int64_t>(blocks) * block_size_;
  stats_.hit_tokens += static_cast<int64_t>(hits) * block_size_;
}

PrefixCacheStats CachingBlockPool::stats() const {
  PrefixCacheStats s = stats_;
  s.enabled = caching_;
  s.cached_blocks = static_cast<int32_t>(by_key_.size());
  return s;
}

}  // namespace helios
