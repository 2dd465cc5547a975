#include "helios/kv_cache.h"

namespace helios {

int64_t KvCacheStorage::bytes_per_block(const ModelConfig& config, int32_t block_size, kernels::KvType type) {
  // K and V, every layer.
  return 2LL * config.n_layer * block_size * config.kv_dim() * kernels::kv_type_bytes(type);
}

StatusOr<KvCacheStorage> KvCacheStorage::create(Backend& backend, const ModelConfig& config,
                                                int32_t n_blocks, int32_t block_size, kernels::KvType type) {
  if (n_blocks <= 0 || block_size <= 0) {
    return invalid_argument("KV cache needs n_blocks > 0 and block_size > 0 (got " +
                            std::to_string(n_blocks) + ", " + std::to_string(block_size) + ")");
  }
  if (!backend.supports_kv_type(type)) {
    return invalid_argument("the " + backend.name() + " backend has no " + kernels::kv_type_name(type) +
                            " KV cache; set engine.kv_cache_type to f32");
  }
  // Blocks are swapped as whole 4-byte words, so a block must hold whole words of values (true
  // for every real model's head_dim).
  const int32_t per_word = 4 / kernels::kv_type_bytes(type);
  if ((static_cast<int64_t>(block_size) * config.kv_dim()) % per_word != 0) {
    return invalid_argument(std::string("an ") + kernels::kv_type_name(type) + " KV cache needs block_size × n_kv_heads × head_dim a multiple of " +
                            std::to_string(per_word) + " (got " + std::to_string(block_size) + " × " +
                            std::to_string(config.kv_dim()) + "); set engine.kv_cache_type to f32");
  }
  KvCacheStorage s;
  s.backend_ = &backend;
  s.n_blocks_ = n_blocks;
  s.block_size_ = block_size;
  s.n_kv_heads_ = config.n_head_kv;
  s.head_dim_ = config.head_dim;
  s.type_ = type;
  const size_t per_layer = static_cast<size_t>(n_blocks) * s.words_per_layer_block();
  for (int32_t l = 0; l < config.n_layer; ++l) {
    s.k_.emplace_back(&backend, per_layer);
    s.v_.emplace_back(&backend, per_layer);
    if (s.k_.back().empty() || s.v_.back().empty()) {
      return resource_exhausted("cannot allocate the KV cache: " + std::to_string(n_blocks) +
                                " blocks × " + std::to_string(bytes_per_block(config, block_size, type)) +
                                " bytes on " + backend.name() + "; use fewer blocks");
    }
  }
  return s;
}

Status KvCacheStorage::grow(int32_t n_blocks) {
  if (n_blocks < n_blocks_) {
    return invalid_argument("the KV cache can only grow: it has " + std::to_string(n_blocks_) + " blocks, asked for " +
                            std::to_string(n_blocks));
  }
  if (n_blocks == n_blocks_) return ok_status();
  // The other ranks first (one that grew before a later failure keeps unused blocks: harmless).
  for (KvCacheStorage& s : shards_) {
    if (s.n_blocks_ < n_blocks) HELIOS_RETURN_IF_ERROR(s.grow(n_blocks));
  }
  const int64_t per_block = words_per_layer_block();
  const size_t old_words = static_cast<size_t>(n_blocks_) * per_block;
  const size_t new_words = static_cast<size_t>(n_blocks) * per_block;
  // Every new buffer before any copy, so a failed allocation leaves the cache as it was.
  std::vector<Buffer> k, v;
  for (size_t l = 0; l < k_.size(); ++l) {
    k.emplace_back(backend_, new_words);
    v.emplace_back(backend_, new_words);
    if (k.back().empty() || v.back().empty()) {
      const int64_t block_bytes = words_per_block() * 4;
      return resource_exhausted("cannot grow the KV cache from " + std::to_string(n_blocks_) + " to " +
                                std::to_string(n_blocks) + " blocks: the new storage needs " +
                                std::to_string(n_blocks * block_bytes) + " bytes on " + backend_->name() +
                                " while the old " + std::to_string(n_blocks_ * block_bytes) + " are still held");
    }
  }
  // Through the host, one buffer at a time: the Backend interface has no device-to-device copy,
  // and this bounds the staging memory to one layer's K (or V).
  std::vector<float> host(old_words);
  for (size_t l = 0; l < k_.size(); ++l) {
    backend_->download(host.data(), k_[l].data(), old_words);
    backend_->upload(k[l].data(), host.data(), old_words);
    backend_->download(host.data(), v_[l].data(), old_words);
    backend_->upload(v[l].data(), host.data(), old_words);
  }
  backend_->synchronize();
  HELIOS_RETURN_IF_ERROR(backend_->error());
  k_ = std::move(k);
  v_ = std::move(v);
  n_blocks_ = n_blocks;
  return ok_status();
}

kernels::PagedKV KvCacheStorage::layer(int32_t l) const {
  return {k_[l].data(), v_[l].data(), n_blocks_, block_size_, n_kv_heads_, head_dim_, type_};
}

int64_t KvCacheStorage::words_per_layer_block() const {
  return static_cast<int64_t>(block_size_) * n_kv_heads_ * head_dim_ * kernels::kv_type_bytes(type_) / 4;
}

int64_t KvCacheStorage::words_per_block() const {
  int64_t n = 2 * static_cast<int64_t>(k_.size()) * words_per_layer_block();
  for (const KvCacheStorage& s : shards_) n += s.words_per_block();
  return n;
}

// Each block's copies go out on the backends' copy streams, after the work already enqueued (the
// passes that wrote the block), and are waited for once, at the end.
void KvCacheStorage::read_block(int32_t block_id, float* host_dst) const {
  const int64_t n = words_per_layer_block();
  backend_->copy_fence();
  for (size_t l = 0; l < k_.size(); ++l) {
    backend_->copy_to_host(host_dst, k_[l].data() + block_id * n, n);
    backend_->copy_to_host(host_dst + n, v_[l].data() + block_id * n, n);
    host_dst += 2 * n;
  }
  for (const KvCacheStorage& s : shards_) {
    s.read_block(block_id, host_dst);
    host_dst += s.words_per_block();
  }
  backend_->copy_wait();
}

void KvCacheStorage::write_block(int32_t block_id, const float* host_src) {
  const int64_t n = words_per_layer_block();
  backend_->copy_fence();
  for (size_t l = 0; l < k_.size(); ++l) {
    backend_->copy_from_host(k_[l].data() + block_id * n, host_src, n);
    backend_->copy_from_host(v_[l].data() + block_id * n, host_src + n, n);
    host_src += 2 * n;
  }
  for (KvCacheStorage& s : shards_) {
    s.write_block(block_id, host_src);
    host_src += s.words_per_block();
  }
  backend_->copy_wait();
}

}  // namespace helios
