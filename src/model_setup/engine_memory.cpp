// Memory for an engine: the forward pass's activations first, then the KV cache from what is left
// (include/helios/model_setup.h).
#include <unistd.h>

#include <algorithm>

#include "helios/model_setup.h"

namespace helios {

StatusOr<KvCacheSize> size_kv_cache(const EngineConfig& engine, const ModelConfig& kv_config, size_t n_models,
                                    int64_t memory_bytes, std::string_view model_name,
                                    kernels::KvType kv_type) {
  const auto models = static_cast<int64_t>(std::max<size_t>(n_models, 1));
  KvCacheSize out;
  out.bytes = engine.kv_cache_bytes > 0
                  ? engine.kv_cache_bytes
                  : static_cast<int64_t>(static_cast<double>(memory_bytes) * engine.kv_cache_fraction);
  out.bytes /= models;
  out.bytes_per_block = KvCacheStorage::bytes_per_block(kv_config, engine.block_size, kv_type);
  out.n_blocks = static_cast<int32_t>(std::min<int64_t>(out.bytes / out.bytes_per_block, 1 << 24));
  if (out.n_blocks < 1) {
    return invalid_argument("engine.kv_cache (" + std::to_string(out.bytes) + " bytes for model '" +
                            std::string(model_name) + "') is smaller than one KV block (" +
                            std::to_string(out.bytes_per_block) + " bytes); give it more memory");
  }
  // Host room for preemption by swap and for paused generations' KV (intercepts: swap and
  // min-waste), whatever the preemption mode. Reserved, not touched until a block is swapped.
  out.n_swap_blocks = static_cast<int32_t>(
      std::min<int64_t>(std::max<int64_t>(engine.swap_space_bytes, 0) / models / out.bytes_per_block, 1 << 24));
  return out;
}

StatusOr<kernels::KvType> resolve_kv_type(const EngineConfig& engine, const Backend& backend) {
  if (!engine.kv_cache_type) {
    return backend.supports_kv_type(kernels::KvType::kF16) ? kernels::KvType::kF16 : kernels::KvType::kF32;
  }
  if (!backend.supports_kv_type(*engine.kv_cache_type)) {
    return invalid_argument("engine.kv_cache_type: the " + backend.name() + " backend has no " +
                            kernels::kv_type_name(*engine.kv_cache_type) +
                            " KV cache; use kv_cache_type: f32 (or auto)");
  }
  return *engine.kv_cache_type;
}

int64_t kv_memory_bytes(const Backend& backend) {
  const size_t free_device = backend.free_device_bytes();
  if (free_device > 0) return static_cast<int64_t>(free_device);
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

StatusOr<EngineOptions> plan_engine(const EngineConfig& engine, Model& model, size_t n_models,
                                    std::string_view model_name, const InterceptConfig& intercepts) {
  // The largest pass the engine runs: one step's tokens. Self-speculative drafts are taken from
  // the same budget, so a verification pass is no larger.
  HELIOS_RETURN_IF_ERROR(model.reserve_workspace(engine.max_batched_tokens));
  HELIOS_ASSIGN_OR_RETURN(const kernels::KvType kv_type, resolve_kv_type(engine, model.backend()));
  // Tensor-parallel ranks in host memory share it: size the cache by every rank's KV heads.
  ModelConfig sizing = model.kv_config();
  if (model.tensor_parallel() > 1 && model.backend().free_device_bytes() == 0) sizing.n_head_kv = model.config().n_head_kv;
  HELIOS_ASSIGN_OR_RETURN(KvCacheSize kv, size_kv_cache(engine, sizing, n_models, kv_memory_bytes(model.backend()),
                                                        model_name, kv_type));
  EngineOptions options;
  options.kv_type = kv_type;
  options.block_size = engine.block_size;
  options.n_kv_blocks = kv.n_blocks;
  options.n_swap_blocks = kv.n_swap_blocks;
  options.queue_limit = engine.queue_limit;
  options.scheduler.max_batched_tokens = engine.max_batched_tokens;
  options.scheduler.max_seqs = engine.max_seqs;
  options.scheduler.preemption = engine.preemption;
  options.intercepts = intercepts;
  options.prefix_caching = engine.prefix_caching;
  options.device_sampling = engine.device_sampling.value_or(model.backend().free_device_bytes() > 0);
  return options;
}

}  // namespace helios
