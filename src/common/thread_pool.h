// A fixed pool of worker threads for data-parallel loops (no global state: each owner has one).
//
// A decode step runs a few hundred short loops (tens of microseconds each), so waking threads
// through the kernel would cost as much as the work: workers spin on an atomic counter for a
// while after each loop and only then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace helios {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // includes the calling thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(begin, end) over [0, n) split into contiguous chunks, a few per thread, each thread
  // taking the next chunk as it finishes one; returns when all chunks are done. Not reentrant:
  // one caller at a time.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker();
  void run_chunks();  // chunks of the current loop until none is left

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};  // bumped to start a loop
  std::atomic<int> pending_{0};          // workers still running the current loop
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 1;
  std::atomic<int64_t> next_chunk_{0};   // the next chunk of the current loop to take
  std::mutex mu_;                        // only for sleeping workers
  std::condition_variable wake_cv_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace helios
