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

void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int n_threads) {
  const int64_t chunk = (n + n_threads - 1) / n_threads;
  const int64_t begin = std::min(n, index * chunk), end = std::min(n, begin + chunk);
  if (begin < end) fn(begin, end);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
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
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the mutex means a worker about to sleep cannot miss the new loop.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (n_sleeping_ > 0) wake_cv_.notify_all();
  run_chunk(fn, n, 0, n_threads_);
  // Spin briefly for the workers, then yield the core: when the machine is oversubscribed the
  // worker we wait for may need this very core to finish.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 2000) HELIOS_CPU_RELAX();
    else std::this_thread::yield();
  }
  job_ = nullptr;
}

void ThreadPool::worker(int index) {
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
    run_chunk(*job_, job_n_, index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace helios
