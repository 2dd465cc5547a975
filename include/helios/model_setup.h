// Setting a model up to run, for the command line (helios generate, eval, calibrate) and the
// server (heliosd) alike: its first layers loaded, its exit points resolved against its depth, the
// exit heads loaded and set, its default exit rule made concrete; and, for an engine, the forward
// pass's activations and the KV cache sized from the memory that is left.
//
// The callers differ only in where the settings come from and what errors call them (config keys
// such as "early_exit.exits" for the server, options such as "--load-layers" for the command line).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "helios/config.h"
#include "helios/engine.h"
#include "helios/model.h"

namespace helios {

struct ModelSetupOptions {
  std::string path;          // the GGUF file
  int32_t load_layers = 0;   // load only the first N blocks; 0 = all
  std::optional<RopeScaling> rope_scaling;  // replaces the file's (ModelLoadOptions)
  ExitPointsSpec exits;      // resolved against the model's depth; points at or past the loaded
                             // depth are dropped (ModelSetup::warning), not refused
  // With no exit points given (no layers, `every` 0): the layers of the heads file, else every
  // 4th layer from layer 4 (dropped past the loaded depth without a warning). Off: no exit points.
  bool default_exits = false;
  std::string heads_path;    // exit-heads sidecar from `helios calibrate`; "" = identity heads
  std::optional<ExitRule> default_rule;  // resolved and checked against the model when given
  LoadProgress progress;
  // Tensor parallelism (ModelLoadOptions): ranks, and the backend of each rank past the first.
  int32_t tensor_parallel = 1;
  std::function<StatusOr<std::unique_ptr<Backend>>(int32_t rank)> make_rank_backend;

  // What errors call the settings: "<name>: <what is wrong>", or the bare message for "".
  struct Names {
    std::string load_layers = "load_layers";
    std::string exits;
    std::string heads;
    std::string rule_prefix;  // before a rule's key: "early_exit." gives "early_exit.depth: ..."
    std::string exits_hint;   // where the exit points are set, for a rule that needs some
  } names;
};

struct ModelSetup {
  std::unique_ptr<Model> model;
  std::vector<int32_t> dropped_exits;  // exit points at or past the loaded depth, not set
  std::string warning;                 // saying so; "" when none was dropped
  ExitRule default_rule;               // options.default_rule resolved; `full` when none was given
};

// Loads the model on `backend` (which must outlive it) and sets its exits. Errors: the loader's
// (NOT_FOUND, INVALID_ARGUMENT, RESOURCE_EXHAUSTED), and INVALID_ARGUMENT naming the setting for
// load_layers past the model's depth, exit points outside it, a heads file that does not fit the
// model and a default rule the model cannot run.
StatusOr<ModelSetup> setup_model(Backend& backend, const ModelSetupOptions& options);

// The backend of tensor-parallel rank `rank` from one backend setting: "cpu", or CUDA device
// N + rank for "cuda" / "cuda:N"; and each rank's CPU threads, `threads` (0: one per core)
// split between `ranks` (at least one each).
std::string rank_backend_name(const std::string& backend, int32_t rank);
int rank_threads(int threads, int32_t ranks);

// `rule` with depth 0 made concrete (fixed-depth: the loaded depth; self-speculative: the first
// exit point), then checked against the model's exit points and with Model::check_exit_rule.
// INVALID_ARGUMENT naming `field_prefix` + the key ("exit.depth: ..."); a policy that needs exit
// points on a model without them says where they are set (`exits_hint`).
StatusOr<ExitRule> resolve_exit_rule(ExitRule rule, const Model& model, std::string_view field_prefix,
                                     std::string_view exits_hint);

// --- Memory for an engine

// The KV cache of one model among `n_models` sharing the memory: `engine.kv_cache_bytes` when
// set, else `engine.kv_cache_fraction` of `memory_bytes`, split evenly between the models, in
// blocks holding K and V of every layer of `kv_config` (the loaded layers: Model::kv_config()).
// Swap mode gets its share of `engine.swap_space_bytes` in host blocks. Blocks hold `kv_type`.
struct KvCacheSize {
  int64_t bytes = 0;            // this model's share
  int64_t bytes_per_block = 0;
  int32_t n_blocks = 0;
  int32_t n_swap_blocks = 0;
};
// INVALID_ARGUMENT naming engine.kv_cache and `model_name` when the share is under one block.
StatusOr<KvCacheSize> size_kv_cache(const EngineConfig& engine, const ModelConfig& kv_config, size_t n_models,
                                    int64_t memory_bytes, std::string_view model_name,
                                    kernels::KvType kv_type = kernels::KvType::kF32);

// engine.kv_cache_type made concrete for `backend`: as set, or f16 where the backend has it and
// f32 elsewhere. INVALID_ARGUMENT when the backend lacks the type that was set.
StatusOr<kernels::KvType> resolve_kv_type(const EngineConfig& engine, const Backend& backend);

// What the KV cache is sized from on `backend`: its free device memory (a GPU), else the
// machine's physical memory (the CPU).
int64_t kv_memory_bytes(const Backend& backend);

// The engine's options for `model` (one of `n_models`): first the forward pass's activations for
// the largest step the engine runs (engine.max_batched_tokens tokens; self-speculative drafts
// count against that budget) are allocated, so that the KV cache, sized next from what is left,
// does not take their memory. RESOURCE_EXHAUSTED when the activations do not fit.
StatusOr<EngineOptions> plan_engine(const EngineConfig& engine, Model& model, size_t n_models,
                                    std::string_view model_name, const InterceptConfig& intercepts = {});

}  // namespace helios
