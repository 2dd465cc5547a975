// The engine: one model, one loop thread. Each iteration is schedule → execute → update:
// the scheduler picks the sequences and token counts, the model runs them as one batch, sampled
// tokens go back to the scheduler and out to each request's stream.
//
// Thread-safety: submit(), abort(), grow_kv(), extend_layers(), status(), progress() and the
// streams are safe from any thread; the loop owns the scheduler, the KV cache and the model.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "helios/config.h"
#include "helios/early_exit.h"
#include "helios/intercept.h"
#include "helios/liveness.h"
#include "helios/prefix_cache.h"
#include "helios/metrics.h"
#include "helios/model.h"
#include "helios/output.h"
#include "helios/sampler.h"
#include "helios/scheduler.h"

namespace helios {

// A request's intercepts: what pauses it, how its KV is held while paused (see helios/intercept.h).
struct InterceptOptions {
  InterceptTriggers triggers;        // none: the request never pauses
  std::optional<HoldPolicy> hold;    // unset: EngineOptions::intercepts.default_hold
  std::string kind;                  // the pause-length prior's name; "" or unknown: t_now − t_call
};

// A validated, tokenized request: its prompt and exit rule, and the output path's options
// (sampling, max_tokens, stop strings and tokens, logprobs).
struct GenerationRequest : OutputOptions {
  std::string client_id;               // for logs and Abort; unique among live requests
  std::vector<TokenId> prompt;
  ExitRule exit;                       // how its tokens leave the layer stack
  // Per generated token, the exit heads' top-1 and its probability at every exit point below the
  // loaded depth (TokenEvent::observed), without changing the output.
  bool observe_exits = false;
  // max_tokens bounds each segment: from the start, or from a resume, to the next pause or end.
  InterceptOptions intercept;
};

struct GenerationUpdate {
  std::vector<TokenEvent> tokens;
  FinishReason finish = FinishReason::kNone;  // set on the last update
  // The generation paused on this update's last token: Engine::resume() or end_paused() it.
  std::optional<InterceptEvent> intercept;
  std::string error;                   // set when the server ended the request (shutdown, internal
                                       // error); empty when the client aborted or cancelled it
  StatusCode error_code = StatusCode::kUnavailable;  // with `error`: UNAVAILABLE (shutdown),
                                       // RESOURCE_EXHAUSTED (it can never fit), INTERNAL (device)
  int32_t prompt_tokens = 0;          // every token given: the prompt and every resume's
  int32_t completion_tokens = 0;      // every token generated, over all segments
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
};

// The channel from the engine to one request's RPC handler.
class RequestStream {
 public:
  void push(GenerationUpdate update);
  // Waits up to `timeout` for updates; returns what arrived (merged), or nullopt on timeout.
  std::optional<GenerationUpdate> pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationUpdate> updates_;
};

// Intercepts of one engine since it started.
struct InterceptStats {
  HoldPolicy default_hold = HoldPolicy::kMinWaste;
  int32_t paused = 0;                      // paused now
  int64_t paused_kv_bytes = 0;             // their KV in device blocks
  int64_t swapped_kv_bytes = 0;            // their KV in host blocks
  int64_t intercepts_total = 0;
  std::map<std::pair<std::string, std::string>, int64_t> decisions;  // (policy, decision) → count
  double waste_preserve = 0, waste_recompute = 0, waste_swap = 0;   // byte·seconds
  double kv_byte_seconds = 0;              // the pool's bytes × time served
  double forward_seconds = 0, recompute_seconds = 0;
  int32_t saturation_tokens = 0;           // S
  double copy_bytes_per_second = 0;
  std::vector<std::pair<int32_t, double>> forward_profile;
};

struct EngineStatus {
  int32_t waiting = 0, running = 0, swapped = 0;
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_block_size = 0;
  // Layers of the model the engine runs: the depth that produced each token reported after it
  // (Engine::extend_layers makes it deeper).
  int32_t loaded_layers = 0;
  std::vector<int32_t> exit_layers;        // the model's exit points at that depth
  int64_t n_params = 0;                    // parameters loaded
  int32_t batch_size = 0, batch_tokens = 0;
  double steps_per_second = 0;
  int64_t preemptions = 0, requests_total = 0, generated_tokens_total = 0;
  // Early exit, over every generated token so far.
  std::vector<int64_t> exit_layer_counts;  // [n_layers + 1]: tokens that left after layer i
  int64_t layers_computed_total = 0;       // layers computed for generated tokens (drafts included)
  int64_t kv_fill_layers_total = 0;        // layers whose K/V was filled from an exit state
  int64_t draft_tokens_total = 0;          // self-speculative: tokens drafted
  int64_t draft_tokens_accepted = 0;       // self-speculative: drafts the full model confirmed
  InterceptStats intercepts;
  PrefixCacheStats prefix_cache;
};

// How the tokens computed before Engine::extend_layers get their K/V at the new layers.
enum class ExtendKv {
  // From each token's state where it left (the old loaded depth, or an earlier exit): one K/V
  // projection per new layer, as early exit fills the layers a token skips. Cheap; the
  // continuation is close to, not always equal to, the deep model's.
  kFillFromExitStates,
  // Every earlier token runs the new layers for real: exact K/V, at the cost of a full prefill
  // of each request's tokens so far.
  kRecompute,
};

// A deeper prefix of the model for Engine::extend_layers.
struct LayerExtension {
  ModelWeights extra;                  // Model::load_layers_range(new depth): the blocks to add
  std::vector<int32_t> exit_layers;    // the exit points at the new depth, as for Model::set_exits
  const ExitHeadSet* heads = nullptr;  // their fitted heads (null: identity); read during the call
  // What the KV pool may hold from now on, in bytes: the old pool's less the new weights', so the
  // pool pays for them. Cut into blocks of the new depth's size.
  int64_t kv_bytes = 0;
  ExtendKv kv = ExtendKv::kFillFromExitStates;
};

struct EngineOptions {
  int32_t n_kv_blocks = 0;             // device KV blocks
  int32_t block_size = 16;
  kernels::KvType kv_type = kernels::KvType::kF32;  // what the blocks hold
  int32_t n_swap_blocks = 0;           // host blocks for swapped-out KV
  // Full blocks of computed prefixes shared between requests and kept after they end
  // (helios/prefix_cache.h); outputs are the same with it off.
  bool prefix_caching = true;
  // Sampled (non-greedy) tokens are drawn where the logits are (Backend::sample_rows) instead of
  // on the host from downloaded rows; the tokens are the same on the CPU, and on a device within
  // rounding (kernels::ref_sample_rows). Rows with a grammar or top logprobs come down either way.
  bool device_sampling = false;
  int32_t queue_limit = 256;           // requests not yet finished, at most
  SchedulerLimits scheduler;
  InterceptConfig intercepts;
  // Called once, from the loop thread, when a backend error faults the engine (the server turns
  // its health NOT_SERVING). May be empty.
  std::function<void(const std::string& error)> on_fault;
};

class Engine {
 public:
  // Sizes the KV cache and starts the loop thread. `metrics` may be null.
  static StatusOr<std::unique_ptr<Engine>> start(Model& model, const EngineOptions& options,
                                                 MetricsRegistry* metrics);
  ~Engine();  // stops the loop; live requests end as aborted

  // Cheap check made before a request is tokenized: false when the queue is full.
  bool has_capacity() const;
  // Queues the request. RESOURCE_EXHAUSTED when the queue is full, ALREADY_EXISTS for the client
  // id of a live request.
  StatusOr<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Ends a request: its stream gets kAborted, with `server_reason` as the error when the server
  // is the one ending it. False if unknown. Its KV blocks are freed by the next step.
  bool abort(const std::string& client_id, const std::string& server_reason = "");
  void abort_all(const std::string& reason);
  // Resumes a paused generation: `appended` (a tool's result, the next human turn, as tokens)
  // joins its context after the trigger, and it generates up to max_tokens more. NOT_FOUND for
  // an unknown id, FAILED_PRECONDITION when it is not paused, INVALID_ARGUMENT for no tokens or a
  // token outside the vocabulary or max_tokens < 1.
  Status resume(const std::string& client_id, std::vector<TokenId> appended, int32_t max_tokens);
  // Ends a paused generation as finished: its stream gets the final update (finish STOP). The
  // same errors as resume() for the id.
  Status end_paused(const std::string& client_id);
  // Grows the device KV pool to n_blocks in all (memory another model gave back). The loop thread
  // applies it between steps, idle or not, so running sequences keep their blocks and data;
  // status().kv_blocks_total shows the new total once it has. An allocation that fails there is
  // logged and the engine serves on with the pool it had. INVALID_ARGUMENT for fewer blocks than
  // the pool has or was asked to grow to; UNAVAILABLE while stopping; INTERNAL when faulted.
  Status grow_kv(int32_t n_blocks);
  // Makes the model deeper in place while requests run: the loop thread applies it between
  // steps, and the call returns once it has, with the loop's status. There, every running and
  // swapped request gives up its KV (recompute), the blocks join the model, the KV pool is made
  // again for the new depth from `kv_bytes` (the old pool freed first), and each request goes on
  // from its tokens so far — none is lost; a request at fixed depth at the old loaded depth now
  // leaves at the new one. status().loaded_layers and kv_blocks_total show the result when this
  // returns. A request the smaller pool cannot hold waits or is refused as any would.
  // INVALID_ARGUMENT for no blocks, a depth past the model's, exit points outside the new depth,
  // a kv_bytes under one block, or a live request whose rule the extended model cannot run;
  // FAILED_PRECONDITION while another extension is pending; UNAVAILABLE while stopping; INTERNAL
  // when faulted; RESOURCE_EXHAUSTED when the new pool or a head does not fit. On an error the
  // engine serves on at the depth it had (its requests recomputed at most). Blocks the caller:
  // never call it from the loop thread (on_fault).
  Status extend_layers(LayerExtension extension);
  size_t n_live() const;
  EngineStatus status() const;
  // Steps completed and work pending, from atomics: no lock, so a watchdog reads it whatever the
  // loop is doing (helios/liveness.h).
  EngineProgress progress() const;
  // Empty while the engine serves; after a backend error (a failed CUDA or cuBLAS call, say) the
  // error, and the engine refuses new requests with INTERNAL.
  std::string fault() const;
  // The model. From other threads read only what extend_layers leaves alone (config, tokenizer):
  // its depth and exits change on the loop thread (status().loaded_layers is the safe read).
  const Model& model() const { return model_; }

 private:
  struct Impl;
  explicit Engine(Model& model);
  Model& model_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace helios
