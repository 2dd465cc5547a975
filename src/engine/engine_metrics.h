// The engine's Prometheus metrics, registered once per engine.
#pragma once

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

  Counter* finished(MetricsRegistry& r, const char* reason) {
    return r.counter("helios_requests_finished_total", "Finished requests by reason", {{"reason", reason}});
  }
};

}  // namespace helios
