// Shard planning and the in-process communicator (tensor_parallel.h).
#include "helios/tensor_parallel.h"

#ifdef HELIOS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace helios {

namespace {

// The state every rank of one in-process group shares: a reusable barrier that an abort opens,
// and each rank's published pointers for the collective in progress.
struct SharedGroup {
  explicit SharedGroup(int32_t w) : world(w), data(w), local(w), width(w), offset(w) {}
  const int32_t world;
  std::mutex mu;
  std::condition_variable cv;
  int32_t arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<float*> data;          // all_reduce_sum: each rank's buffer
  std::vector<const float*> local;   // all_gather_columns: each rank's columns
  std::vector<int32_t> width, offset;

  // Every rank arrives before any leaves; false (at once) once a rank aborted.
  bool barrier() {
    std::unique_lock<std::mutex> lock(mu);
    if (aborted) return false;
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    return !aborted;
  }
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<SharedGroup> g, int32_t rank) : g_(std::move(g)), rank_(rank) {}
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return g_->world; }

  void all_reduce_sum(float* data, size_t n) override {
    g_->data[rank_] = data;
    if (!g_->barrier()) return;
    // This rank sums its chunk of the elements over every rank, in rank order, and writes the sum
    // back to every rank's buffer: no element is touched by two threads.
    const size_t w = static_cast<size_t>(g_->world), r = static_cast<size_t>(rank_);
    const size_t i0 = n * r / w, i1 = n * (r + 1) / w;
    for (size_t i = i0; i < i1; ++i) {
      float s = g_->data[0][i];
      for (size_t k = 1; k < w; ++k) s += g_->data[k][i];
      for (size_t k = 0; k < w; ++k) g_->data[k][i] = s;
    }
    g_->barrier();
  }

  void all_gather_columns(const float* local, int32_t n_rows, int32_t width, int32_t offset, float* out,
                          int32_t out_width) override {
    g_->local[rank_] = local;
    g_->width[rank_] = width;
    g_->offset[rank_] = offset;
    if (!g_->barrier()) return;
    for (int32_t k = 0; k < g_->world; ++k) {
      const int32_t wk = g_->width[k], ok = g_->offset[k];
      if (wk <= 0 || ok >= out_width) continue;
      const int32_t n_copy = std::min(wk, out_width - ok);
      for (int32_t r = 0; r < n_rows; ++r) {
        std::memcpy(out + static_cast<size_t>(r) * out_width + ok, g_->local[k] + static_cast<size_t>(r) * wk,
                    sizeof(float) * static_cast<size_t>(n_copy));
      }
    }
    g_->barrier();  // no rank reuses its columns before every rank has copied them
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->aborted = true;
    g_->cv.notify_all();
  }
  void reset() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->aborted = false;
    g_->arrived = 0;
  }

 private:
  std::shared_ptr<SharedGroup> g_;
  int32_t rank_;
};

// [part * n / parts, (part + 1) * n / parts) of n units: the even split, larger parts last.
std::pair<int32_t, int32_t> split(int32_t n, int32_t part, int32_t parts) {
  return {static_cast<int32_t>(static_cast<int64_t>(n) * part / parts),
          static_cast<int32_t>(static_cast<int64_t>(n) * (part + 1) / parts)};
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int32_t world) {
  auto g = std::make_shared<SharedGroup>(world);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int32_t r = 0; r < world; ++r) out.push_back(std::make_unique<InProcessCommunicator>(g, r));
  return out;
}

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_communicators(const std::vector<Backend*>& ranks) {
  std::string names;
  bool all_cpu = true, all_cuda = true;
  for (const Backend* b : ranks) {
    names += (names.empty() ? "" : ", ") + b->name();
    all_cpu = all_cpu && b->name() == "cpu";
    all_cuda = all_cuda && b->name().rfind("cuda", 0) == 0;
  }
  if (all_cpu) return make_in_process_group(static_cast<int32_t>(ranks.size()));
#ifdef HELIOS_WITH_CUDA
  if (all_cuda) return make_nccl_group(ranks);
#endif
  return invalid_argument("tensor parallelism runs on CPU backends (one process) or on CUDA backends (NCCL, in a "
                          "CUDA build); the ranks are on " + names);
}

StatusOr<ShardSpec> plan_shard(const ModelConfig& c, int32_t rank, int32_t world, int32_t ff_granule,
                               int32_t o_granule) {
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_argument("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world) +
                            ": the world size must be >= 1 and the rank in 0..world-1");
  }
  ShardSpec s;
  s.rank = rank;
  s.world = world;
  if (c.n_head_kv < world) {
    return invalid_argument("tensor_parallel " + std::to_string(world) + " needs at least " + std::to_string(world) +
                            " KV heads to give each rank one; " + c.name + " has " + std::to_string(c.n_head_kv) +
                            " (use tensor_parallel <= " + std::to_string(c.n_head_kv) + ")");
  }
  const int32_t group = c.n_head / c.n_head_kv;  // query heads per KV head
  std::tie(s.kv_head0, s.kv_head1) = split(c.n_head_kv, rank, world);
  s.head0 = s.kv_head0 * group;
  s.head1 = s.kv_head1 * group;
  for (int32_t col : {s.head0 * c.head_dim, s.head1 * c.head_dim}) {
    if (o_granule > 0 && col % o_granule != 0) {
      return invalid_argument("tensor_parallel " + std::to_string(world) + ": the output projection's columns split at " +
                              std::to_string(col) + ", inside one of its " + std::to_string(o_granule) +
                              "-value weight blocks (" + c.name + "); choose another world size");
    }
  }
  if (ff_granule < 1 || c.n_ff % ff_granule != 0 || c.n_ff / ff_granule < world) {
    return invalid_argument("tensor_parallel " + std::to_string(world) + ": the FFN's " + std::to_string(c.n_ff) +
                            " hidden units are not " + std::to_string(world) + " or more whole " +
                            std::to_string(ff_granule) + "-value blocks (" + c.name + ")");
  }
  const auto [f0, f1] = split(c.n_ff / ff_granule, rank, world);
  s.ff0 = f0 * ff_granule;
  s.ff1 = f1 * ff_granule;
  const int32_t rows64 = (c.n_vocab + 63) / 64;
  if (rows64 < world) {
    return invalid_argument("tensor_parallel " + std::to_string(world) + ": a vocabulary of " +
                            std::to_string(c.n_vocab) + " is too small to split in rows of 64");
  }
  const auto [v0, v1] = split(rows64, rank, world);
  s.vocab0 = v0 * 64;
  s.vocab1 = std::min(c.n_vocab, v1 * 64);
  return s;
}

ModelConfig shard_config(const ModelConfig& c, const ShardSpec& s) {
  if (!s.sharded()) return c;
  ModelConfig r = c;
  r.n_head = s.head1 - s.head0;
  r.n_head_kv = s.kv_head1 - s.kv_head0;
  r.n_ff = s.ff1 - s.ff0;
  return r;
}

}  // namespace helios
