#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define HELIOS_CPU_RELAX() _mm_pause()
#else
#define HELIOS_CPU_RELAX() std::this_thread::yield()
#endif

namespace helios {
namespace {

// How long an idle worker spins before it sleeps: longer than the gap between two loops of one
// decode step, much shorter than the gap between requests.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Chunks per thread: threads take the next chunk as they finish one, so that a thread slowed by
// the other's memory traffic (or by the machine) does not keep the loop waiting on its half.
constexpr int64_t kChunksPerThread = 4;

// Items per chunk: a multiple of 8 where there are many, so that kernels tiling several rows keep
// whole tiles.
int64_t chunk_size(int64_t n, int n_threads) {
  const int64_t c = (n + n_threads * kChunksPerThread - 1) / (n_threads * kChunksPerThread);
  return n >= 8 * n_threads * kChunksPerThread ? (c + 7) / 8 * 8 : c;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n_threads_ == 1 || n <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk_size(n, n_threads_);
  next_chunk_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the mutex means a worker about to sleep cannot miss the new loop.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (n_sleeping_ > 0) wake_cv_.notify_all();
  run_chunks();
  // Spin briefly for the workers, then yield the core: when the machine is oversubscribed the
  // worker we wait for may need this very core to finish.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 2000) HELIOS_CPU_RELAX();
    else std::this_thread::yield();
  }
  job_ = nullptr;
}

void ThreadPool::run_chunks() {
  for (;;) {
    const int64_t begin = next_chunk_.fetch_add(1, std::memory_order_relaxed) * job_chunk_;
    if (begin >= job_n_) return;
    (*job_)(begin, std::min(job_n_, begin + job_chunk_));
  }
}

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    // Spin for new work, then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      if (++spins < 2000) HELIOS_CPU_RELAX();
      else std::this_thread::yield();
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        ++n_sleeping_;
        wake_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
        --n_sleeping_;
      }
    }
    if (stop_) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace helios
