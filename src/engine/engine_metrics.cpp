#include "engine/engine_metrics.h"

namespace helios {

EngineMetrics::EngineMetrics(MetricsRegistry& r)
    : running(r.gauge("helios_requests_running", "Requests with a sequence in the running batch")),
      waiting(r.gauge("helios_requests_waiting", "Requests queued for their first step or preempted")),
      kv_usage(r.gauge("helios_kv_cache_usage_ratio", "Fraction of KV cache blocks in use")),
      batch_size(r.gauge("helios_batch_size", "Sequences in the last step")),
      kv_blocks_total(r.gauge("helios_kv_blocks_total", "KV cache blocks, all engines: follows the pool as it grows")),
      prompt_tokens(r.counter("helios_prompt_tokens_total", "Prompt tokens of finished requests")),
      generated_tokens(r.counter("helios_generation_tokens_total", "Generated tokens")),
      preemptions(r.counter("helios_preemptions_total", "Sequences preempted for KV cache space")),
      ttft(r.histogram("helios_time_to_first_token_seconds", "Time from arrival to the first token",
                       {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})),
      tpot(r.histogram("helios_time_per_output_token_seconds", "Mean time per generated token after the first",
                       {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})),
      e2e(r.histogram("helios_e2e_request_latency_seconds", "Time from arrival to the last token",
                      {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120})),
      batch_hist(r.histogram("helios_batch_size_sequences", "Sequences per step", {1, 2, 4, 8, 16, 32, 64, 128, 256})),
      exit_layer(r.histogram("helios_exit_layer", "Layer at which each generated token left the stack",
                             {1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 80})),
      layers_per_token(r.histogram("helios_layers_computed_per_token",
                                   "Blocks computed for each generated token (self-speculative drafts included)",
                                   {1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 80, 128})),
      kv_fill_layers(r.counter("helios_kv_fill_layers_total", "Token-layers whose K/V was filled from an exit state")),
      draft_tokens(r.counter("helios_speculative_draft_tokens_total", "Self-speculative tokens drafted")),
      accepted_tokens(r.counter("helios_speculative_accepted_tokens_total",
                                "Self-speculative drafts the full model confirmed")),
      cache_hit_tokens(r.counter("helios_prefix_cache_hit_tokens_total", "Prompt tokens whose K/V came from the prefix cache")),
      cache_query_tokens(r.counter("helios_prefix_cache_query_tokens_total", "Prompt tokens (whole blocks) looked up in the prefix cache")),
      cache_hit_blocks(r.counter("helios_prefix_cache_hit_blocks_total", "KV blocks found in the prefix cache")),
      cache_query_blocks(r.counter("helios_prefix_cache_query_blocks_total", "KV blocks looked up in the prefix cache")),
      cache_evictions(r.counter("helios_prefix_cache_evictions_total", "Cached KV blocks reused for new ones")),
      cached_blocks(r.gauge("helios_prefix_cache_blocks", "KV blocks in the prefix cache (held or kept)")),
      paused(r.gauge("helios_paused_sequences", "Generations paused for a tool call or a human turn")),
      paused_kv_bytes(r.gauge("helios_paused_kv_bytes", "KV bytes paused generations hold in device blocks")) {}

}  // namespace helios
