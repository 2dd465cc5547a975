// Tensor parallelism (Megatron style): every rank holds a slice of each block — its own query and
// KV heads (column-parallel Q/K/V), its own share of the FFN's hidden units (column-parallel
// gate/up, row-parallel down), the output projection's columns of its heads (row-parallel O) —
// and a slice of the LM head's vocabulary. The residual stream is replicated: after O and after
// down each rank holds a partial sum, and one all-reduce makes it whole on every rank. The LM
// head's logits are gathered, so exit decisions and sampling see the whole vocabulary, the same
// bits on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "helios/backend.h"
#include "helios/model_config.h"
#include "helios/status.h"

namespace helios {

// Collective operations between the ranks of one tensor-parallel model, on each rank's backend
// memory. Every rank calls every collective in the same order; each returns with the same bits on
// every rank.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t world() const = 0;
  // data[i] = the sum over ranks of data[i], n floats.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // out [n_rows, out_width] gets, at columns [offset_r, offset_r + width_r), rank r's `local`
  // [n_rows, width_r]; widths and offsets are each rank's own (they may differ between ranks).
  virtual void all_gather_columns(const float* local, int32_t n_rows, int32_t width, int32_t offset, float* out,
                                  int32_t out_width) = 0;
  // A rank that fails mid-pass calls this so that the others return from their collectives
  // instead of waiting for it (their results are then garbage, and the pass fails); reset() before
  // the next pass. NCCL's aborts the group's communicators and reset() makes them again.
  virtual void abort() {}
  virtual void reset() {}
  // The first collective that failed (sticky, like Backend::error()): the pass's sums are garbage.
  virtual Status error() const { return ok_status(); }
};

// `world` ranks in one process, one thread each, on host-memory (CPU) backends. Sums are taken in
// rank order, so every rank gets the same bits whatever the threads' timing.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int32_t world);

// The communicators for ranks on these backends (rank r on ranks[r]): the in-process group for
// CPU backends, NCCL for CUDA backends (CUDA builds). INVALID_ARGUMENT for a mix, or for CUDA
// backends in a build without CUDA.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_communicators(const std::vector<Backend*>& ranks);

// What one rank holds: ranges over heads, KV heads, FFN hidden units and vocabulary rows.
struct ShardSpec {
  int32_t rank = 0;
  int32_t world = 1;
  int32_t head0 = 0, head1 = 0;      // query heads [head0, head1)
  int32_t kv_head0 = 0, kv_head1 = 0;
  int32_t ff0 = 0, ff1 = 0;          // FFN hidden units
  int32_t vocab0 = 0, vocab1 = 0;    // LM-head rows (multiples of 64 but the last)
  bool sharded() const { return world > 1; }
};

// The shard of rank `rank` of `world` for a model: KV heads split as evenly as can be (each query
// head stays with its KV head), FFN hidden units in whole blocks of `ff_granule` (the largest
// block of the down projection's type: 256 for K-quants), vocabulary in rows of 64, the output
// projection's columns on its weight blocks (`o_granule`). INVALID_ARGUMENT naming the dimension
// that does not split, and what would.
StatusOr<ShardSpec> plan_shard(const ModelConfig& c, int32_t rank, int32_t world, int32_t ff_granule,
                               int32_t o_granule);

// The config a rank runs: its heads and FFN width (head_dim, n_embd and n_vocab unchanged).
ModelConfig shard_config(const ModelConfig& c, const ShardSpec& s);

}  // namespace helios
