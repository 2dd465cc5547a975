#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace helios {
namespace {

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, ManyShortLoopsInARowAllComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 20000; ++round) {
    pool.parallel_for(4, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
  }
  EXPECT_EQ(total.load(), 4 * 20000);
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // longer than the spin time
    pool.parallel_for(2, [&](int64_t, int64_t) { calls.fetch_add(1); });
  }
  EXPECT_EQ(calls.load(), 6);
}

// A slow chunk does not hold back the rest of the loop: the other thread takes the chunks left.
// Chunk 0 stays busy until every other item is done (or 10 s pass, which a pool that split the
// loop up front would need), so the test does not depend on how the machine schedules threads.
TEST(ThreadPool, AThreadSlowedOnOneChunkLeavesTheRestToTheOthers) {
  ThreadPool pool(2);
  const int64_t n = 64;
  std::vector<std::thread::id> ran_on(n);
  std::atomic<int64_t> others_done{0};
  pool.parallel_for(n, [&](int64_t begin, int64_t end) {
    if (begin == 0) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (others_done.load() < n - end && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int64_t i = begin; i < end; ++i) ran_on[i] = std::this_thread::get_id();
    if (begin != 0) others_done.fetch_add(end - begin);
  });
  int64_t with_first = 0;
  for (int64_t i = 0; i < n; ++i) with_first += ran_on[i] == ran_on[0];
  EXPECT_LE(with_first, n / 4) << "the thread slowed on chunk 0 ran " << with_first << " of " << n << " items";
}

}  // namespace
}  // namespace helios
