// Making the served model deeper while requests run (Engine::extend_layers). The caller loads the
// new blocks (Model::load_layers_range) off the loop; the loop applies them between steps:
//   check       every request the engine holds can run its rule on the deeper model
//   recompute   every sequence gives up its KV: the pool's shape (its layers) changes under all
//   new pool    the old pool freed, one of the new depth allocated from the bytes given
//   append      the blocks join the model, with the new depth's exits (under the engine mutex,
//               which submit() checks rules under)
//   adopt       the allocator, swap space, rules and counters follow the new depth
// A failure before `append` puts back a pool of the old shape and size; the requests then just
// recompute at the old depth.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "engine/engine_impl.h"

namespace helios {
namespace {

// A fixed-depth rule at the loaded depth (0 or the depth itself) follows it to the new depth;
// every other rule is kept as it is.
ExitRule rule_after_extension(ExitRule rule, int32_t old_depth, int32_t new_depth) {
  if (rule.policy == ExitPolicy::kFixedDepth && (rule.depth == 0 || rule.depth == old_depth)) rule.depth = new_depth;
  return rule;
}

}  // namespace

Status Engine::extend_layers(LayerExtension extension) {
  std::future<Status> applied;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return unavailable("the server is shutting down");
    if (!impl_->fault_reason.empty()) return internal_error(impl_->fault_reason);
    if (impl_->pending_extension) {
      return failed_precondition("another layer extension is still being applied; retry when it returns");
    }
    const int32_t depth = impl_->snapshot.loaded_layers;
    const auto n_new = static_cast<int32_t>(extension.extra.layers.size());
    if (n_new == 0 || depth + n_new > model_.config().n_layer) {
      return invalid_argument("the engine runs " + std::to_string(depth) + " of " +
                              std::to_string(model_.config().n_layer) + " layers and can extend to " +
                              std::to_string(depth + 1) + ".." + std::to_string(model_.config().n_layer) +
                              "; the extension adds " + std::to_string(n_new) + " blocks");
    }
    impl_->pending_extension = std::make_unique<Impl::PendingExtension>();
    impl_->pending_extension->extension = std::move(extension);
    applied = impl_->pending_extension->done.get_future();
  }
  impl_->cv.notify_all();
  return applied.get();
}

void Engine::Impl::apply_layer_extension() {
  std::unique_ptr<PendingExtension> job;
  std::string faulted;
  {
    std::lock_guard<std::mutex> lock(mu);
    job.swap(pending_extension);
    faulted = fault_reason;
  }
  if (!job) return;
  const auto t0 = Clock::now();
  const int32_t old_depth = model.n_layers_loaded();
  const Status st = faulted.empty() ? extend_layers(job->extension) : internal_error(faulted);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (st.ok()) {
    spdlog::info("the model runs {} layers (was {}), a KV pool of {} blocks; {} requests recompute ({}), in {:.2f} ms",
                 model.n_layers_loaded(), old_depth, kv_manager.n_blocks(), live.size(),
                 job->extension.kv == ExtendKv::kRecompute ? "every layer" : "new layers filled from exit states", ms);
  } else {
    spdlog::error("extending the model from {} layers failed: {}", old_depth, st.message());
  }
  job->done.set_value(st);
}

Status Engine::Impl::extend_layers(LayerExtension& x) {
  const int32_t old_depth = model.n_layers_loaded();
  const int32_t new_depth = old_depth + static_cast<int32_t>(x.extra.layers.size());
  ModelConfig kv_config = model.config();
  kv_config.n_layer = new_depth;
  const int64_t block_bytes = KvCacheStorage::bytes_per_block(kv_config, options.block_size, options.kv_type);
  const int64_t n_blocks = std::min<int64_t>(x.kv_bytes / block_bytes, std::numeric_limits<int32_t>::max());
  if (n_blocks < 1) {
    return invalid_argument("kv_bytes " + std::to_string(x.kv_bytes) + " is less than one KV block at " +
                            std::to_string(new_depth) + " layers (" + std::to_string(block_bytes) + " bytes)");
  }

  // check: the exits, then the requests the loop holds (those still arriving are checked under
  // the lock below). append_layers checks the exits again; here a bad one costs nothing.
  for (int32_t layer : x.exit_layers) {
    if (layer < 1 || layer >= new_depth) {
      return invalid_argument("exit layer " + std::to_string(layer) + " is outside 1.." + std::to_string(new_depth - 1) +
                              " (the layers of the extended model but the last)");
    }
  }
  std::vector<GenerationRequest*> held;
  for (auto& [id, r] : live) held.push_back(&r->request);
  HELIOS_RETURN_IF_ERROR(check_rules_after(x, new_depth, held));

  // recompute, new pool
  scheduler.recompute_all();
  const int32_t old_blocks = kv_manager.n_blocks();
  if (Status st = remake_kv(kv_config, static_cast<int32_t>(n_blocks)); !st.ok()) {
    if (Status back = remake_kv(model.kv_config(), old_blocks); !back.ok()) fault(back);
    return st;
  }

  // append
  Status appended;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<GenerationRequest*> queued;
    for (auto& [request, stream] : incoming) queued.push_back(&request);
    appended = check_rules_after(x, new_depth, queued);
    if (appended.ok()) appended = model.append_layers(std::move(x.extra), x.exit_layers, x.heads);
    if (appended.ok()) {
      for (GenerationRequest* request : queued) request->exit = rule_after_extension(request->exit, old_depth, new_depth);
      // The gauge before the snapshot: whoever sees the new total in status() sees it counted.
      if (metrics) metrics->kv_blocks_total->add(static_cast<double>(n_blocks - old_blocks));
      snapshot.kv_blocks_total = static_cast<int32_t>(n_blocks);
      snapshot.loaded_layers = new_depth;
      snapshot.exit_layers = model.exit_layers();
      snapshot.n_params = model.weights().n_params;
      // A pending grow_kv counted blocks of the old depth's size: the new pool replaces it.
      pending_kv_blocks = 0;
    }
  }
  if (!appended.ok()) {
    if (Status back = remake_kv(model.kv_config(), old_blocks); !back.ok()) fault(back);
    return appended;
  }

  adopt_new_depth(old_depth, x.kv, static_cast<int32_t>(n_blocks));
  return ok_status();
}

Status Engine::Impl::check_rules_after(const LayerExtension& x, int32_t new_depth,
                                       const std::vector<GenerationRequest*>& requests) const {
  const int32_t old_depth = model.n_layers_loaded();
  for (const GenerationRequest* request : requests) {
    const ExitRule rule = rule_after_extension(request->exit, old_depth, new_depth);
    if (Status st = model.check_exit_rule_at(rule, new_depth, x.exit_layers, x.heads); !st.ok()) {
      return invalid_argument("request '" + request->client_id + "' could not run its exit rule on the model at " +
                              std::to_string(new_depth) + " layers: " + st.message() +
                              "; keep its exit points (or wait for it to finish) to extend");
    }
  }
  return ok_status();
}

Status Engine::Impl::remake_kv(const ModelConfig& kv_config, int32_t n_blocks) {
  kv = KvCacheStorage();  // the old pool first: old and new are never held together
  HELIOS_ASSIGN_OR_RETURN(kv, KvCacheStorage::create(model.backend(), kv_config, n_blocks, options.block_size,
                                                     options.kv_type));
  return ok_status();
}

void Engine::Impl::adopt_new_depth(int32_t old_depth, ExtendKv kv_mode, int32_t n_blocks) {
  const int32_t new_depth = model.n_layers_loaded();
  kv_manager.reset_device(n_blocks);
  // Swap blocks hold every layer too: the same count, of the new size.
  swap_space.reset();
  swap_space = HostBuffer(&model.backend(), static_cast<size_t>(options.n_swap_blocks) * kv.words_per_block());
  for (auto& [id, r] : live) {
    r->request.exit = rule_after_extension(r->request.exit, old_depth, new_depth);
    // Replayed at their known exit layers, the tokens so far get the new layers' K/V from those
    // exit states; forgotten, they run every layer.
    if (kv_mode == ExtendKv::kRecompute) r->forget_exit_layers();
  }
  exit_layer_counts.resize(new_depth + 1, 0);
  publish_queues();
}

}  // namespace helios
