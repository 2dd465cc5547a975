// The engine's Prometheus metrics, registered once per engine.
#pragma once

#include <string>

#include "helios/metrics.h"

namespace helios {

struct EngineMetrics {
  explicit EngineMetrics(MetricsRegistry& r);

  Gauge *running, *waiting, *kv_usage, *batch_size;
  // Shared by every engine on the registry: each adds its blocks when it starts and as its pool
  // grows, and takes them back when it is destroyed.
  Gauge* kv_blocks_total;
  Counter *prompt_tokens, *generated_tokens, *preemptions;
  Histogram *ttft, *tpot, *e2e, *batch_hist, *exit_layer, *layers_per_token;
  Counter *kv_fill_layers, *draft_tokens, *accepted_tokens;

  // Prefix caching.
  Counter *cache_hit_tokens, *cache_query_tokens, *cache_hit_blocks, *cache_query_blocks, *cache_evictions;
  Gauge* cached_blocks;
  // Step graphs (CUDA): decode steps replayed, captured, or run op by op.
  Counter *steps_replayed, *steps_captured, *steps_op_by_op;
  // Intercepts.
  Gauge *paused, *paused_kv_bytes;
  Counter* waste(MetricsRegistry& r, const char* cause) {
    return r.counter("helios_intercept_waste_byte_seconds_total",
                     "KV memory x time that produced nothing, by cause (INFERCEPT's waste)", {{"cause", cause}});
  }
  Counter* intercepts(MetricsRegistry& r, const char* policy, const std::string& decision) {
    return r.counter("helios_intercepts_total", "Pauses by hold policy and how each was held in the end",
                     {{"policy", policy}, {"decision", decision}});
  }

  Counter* finished(MetricsRegistry& r, const char* reason) {
    return r.counter("helios_requests_finished_total", "Finished requests by reason", {{"reason", reason}});
  }
};

}  // namespace helios
