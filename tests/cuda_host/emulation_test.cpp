// The host emulation of CUDA itself: what the GPU tests rely on when they run without a GPU.
// Kernels here are lambdas launched through cuda_host::launch, as translate.py rewrites a
// kernel<<<...>>> launch; a faulting kernel runs in a death test, as its error is sticky.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "cuda_host/device.h"

namespace helios::cuda_host {
namespace {

template <typename T>
T* device_array(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

constexpr int kThreads = 128;

// Each thread writes its slot, then reads its neighbour's: right only across a barrier.
void neighbour_kernel(int* out, bool with_barrier) {
  auto& slots = shared_at<int[kThreads]>(1);
  const int t = threadIdx.x;
  slots[t] = t;
  if (with_barrier) __syncthreads();
  out[t] = slots[(t + 1) % kThreads];
}

TEST(CudaHost, BarrierOrdersSharedMemory) {
  int* d = device_array<int>(kThreads);
  launch("neighbour", 1, kThreads).run([=] { neighbour_kernel(d, true); });
  const std::vector<int> got = to_host(d, kThreads);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], (t + 1) % kThreads) << "thread " << t;
  cudaFree(d);
}

TEST(CudaHost, AMissingBarrierReadsWhatNoThreadWroteYet) {
  // Threads run in a shuffled order between barriers, and shared memory starts as 0xFF bytes: some
  // thread reads its neighbour's slot before the neighbour wrote it.
  int* d = device_array<int>(kThreads);
  launch("neighbour", 1, kThreads).run([=] { neighbour_kernel(d, false); });
  const std::vector<int> got = to_host(d, kThreads);
  int unwritten = 0;
  for (int t = 0; t < kThreads; ++t) unwritten += got[t] == -1;
  EXPECT_GT(unwritten, 0);
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(got[t] == -1 || got[t] == (t + 1) % kThreads) << "thread " << t;
  cudaFree(d);
}

TEST(CudaHost, ShufflesMoveLanesValues) {
  float* d = device_array<float>(2 * 64);
  launch("shuffles", 1, 64).run([=] {
    const int lane = threadIdx.x % 32;
    float sum = static_cast<float>(threadIdx.x);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    d[threadIdx.x] = sum;
    d[64 + threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<float>(lane * 10), 3);
  });
  const std::vector<float> got = to_host(d, 2 * 64);
  for (int t = 0; t < 64; ++t) {
    const int warp = t / 32, lane = t % 32;
    EXPECT_EQ(got[t], static_cast<float>(32 * 31 / 2 + 32 * 32 * warp)) << "thread " << t;
    EXPECT_EQ(got[64 + t], static_cast<float>((lane + 3 < 32 ? lane + 3 : lane) * 10)) << "thread " << t;
  }
  cudaFree(d);
}

TEST(CudaHost, BlocksSeeTheirPlaceInTheGrid) {
  int* d = device_array<int>(6 * 64);
  launch("places", dim3(3, 2), 64).run([=] {
    const int block = blockIdx.y * gridDim.x + blockIdx.x;
    d[block * blockDim.x + threadIdx.x] = block * 1000 + threadIdx.x;
  });
  const std::vector<int> got = to_host(d, 6 * 64);
  for (int i = 0; i < 6 * 64; ++i) EXPECT_EQ(got[i], i / 64 * 1000 + i % 64);
  cudaFree(d);
}

TEST(CudaHost, ABadConfigurationIsTheLaunchsOwnError) {
  int* d = device_array<int>(1);
  launch("too_wide", 1, 2048).run([=] { d[0] = 1; });
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  launch("too_much_shared", 1, 32, 64 * 1024).run([=] { d[0] = 1; });
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  cudaFree(d);
}

TEST(CudaHost, StreamWorkWaitsUntilSomethingWaitsForIt) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = device_array<int>(1);
  int host = 0;
  ASSERT_EQ(cudaMemsetAsync(d, 0, sizeof(int), s), cudaSuccess);
  launch("seven", 1, 32, 0, s).run([=] {
    if (threadIdx.x == 0) d[0] = 7;
  });
  int* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), sizeof(int), cudaHostAllocDefault), cudaSuccess);
  *pinned = 0;
  ASSERT_EQ(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(*pinned, 0) << "a copy into pinned memory is done only once the stream is synchronised";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(*pinned, 7);
  ASSERT_EQ(cudaMemcpyAsync(&host, d, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(host, 7) << "a copy into pageable memory returns done";
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(CudaHost, AnEventOrdersOneStreamAfterAnother) {
  cudaStream_t a, b;
  cudaEvent_t e;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  int* d = device_array<int>(2);
  launch("first", 1, 32, 0, a).run([=] {
    if (threadIdx.x == 0) d[0] = 5;
  });
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  launch("second", 1, 32, 0, b).run([=] {
    if (threadIdx.x == 0) d[1] = d[0] + 1;
  });
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);  // runs a's work first, as the event says
  int got[2];
  ASSERT_EQ(cudaMemcpyAsync(got, d, sizeof got, cudaMemcpyDeviceToHost, b), cudaSuccess);
  EXPECT_EQ(got[0], 5);
  EXPECT_EQ(got[1], 6);
  cudaFree(d);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(CudaHost, AGraphReplaysTheCapturedWorkWithTheCapturedArguments) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = device_array<int>(1);
  ASSERT_EQ(cudaMemset(d, 0, sizeof(int)), cudaSuccess);
  int step = 3;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  launch("add_step", 1, 32, 0, s).run([=] {
    if (threadIdx.x == 0) d[0] += step;
  });
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  step = 100;  // the graph keeps the arguments of its capture
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(to_host(d, 1)[0], 0) << "capturing runs nothing";
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(to_host(d, 1)[0], 6);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(CudaHost, SynchronisingOrAllocatingWhileCapturingInvalidatesTheCapture) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  cudaStreamDestroy(s);
}

TEST(CudaHost, MemoryBeyondTheDevicesIsAnAllocationError) {
  void* p = nullptr;
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaFree(reinterpret_cast<void*>(&free_bytes)), cudaErrorInvalidValue) << "not a device allocation";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

// A kernel that breaks a rule ends with the sticky launch failure and says what it broke.
void expect_fault(void (*kernel)(), int threads, const char* what, bool chained = false) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the fork re-runs the test up to the launch
  EXPECT_EXIT(
      {
        const Launch plain = launch("rule_breaker", 1, threads);
        (chained ? plain.chained() : plain).run([=] { kernel(); });
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), what);
}

TEST(CudaHostDeathTest, LanesOfAShuffleWaitingAtABarrierAreAFault) {
  expect_fault(
      [] {
        if (threadIdx.x < 16) {
          (void)__shfl_xor_sync(0xffffffffu, 1, 1);
        } else {
          __syncthreads();
        }
      },
      32,
      "rule_breaker block \\(0,0,0\\): warp 0: lanes 0x0000ffff wait at a shuffle of mask 0xffffffff while lanes "
      "0xffff0000 wait at __syncthreads");
}

TEST(CudaHostDeathTest, AShuffleMissingALaneOfItsMaskIsAFault) {
  expect_fault(
      [] {
        if (threadIdx.x == 5) return;
        (void)__shfl_xor_sync(0xffffffffu, 1, 1);
      },
      32, "lanes 0x00000020 have returned");
}

TEST(CudaHostDeathTest, AKernelReadingPastItsAllocationIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* d = device_array<float>(1000);  // 4096 bytes at cudaMalloc's granularity: block 2 is past them
        launch("overrun", 3, 512).run([=] { d[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f; });
        cudaDeviceSynchronize();
      },
      "kernel fault: overrun block \\(2,0,0\\) thread \\([0-9]+,0,0\\) touched 0x[0-9a-f]+, outside every allocation");
}

TEST(CudaHostDeathTest, StaticSharedMemoryOverTheLimitIsAFault) {
  expect_fault([] { shared_at<char[64 * 1024]>(2)[threadIdx.x] = 0; }, 32,
               "static shared memory over 49152 bytes");
}

// A chained launch (common.cuh's launch_chained) may start before the kernel ahead of it is done:
// each of its threads calls inputs_ready() before it touches anything, at a barrier, a shuffle or
// its end at the latest. One that gets there first is a fault; so is one that never calls it.
TEST(CudaHost, AChainedLaunchWhoseThreadsWaitForTheirInputsRuns) {
  int* d = device_array<int>(kThreads);
  launch("chained", 1, kThreads).chained().run([=] {
    inputs_ready();
    neighbour_kernel(d, true);
  });
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host(d, kThreads)[0], 1);
  cudaFree(d);
}

TEST(CudaHostDeathTest, AChainedLaunchsThreadReachingABarrierBeforeItsInputsAreReadyIsAFault) {
  expect_fault(
      [] {
        __syncthreads();
        inputs_ready();
      },
      64, "rule_breaker block \\(0,0,0\\): a thread of a chained launch waits at __syncthreads before "
          "cuda::inputs_ready\\(\\)", true);
}

TEST(CudaHostDeathTest, AChainedLaunchsThreadThatNeverWaitsForItsInputsIsAFault) {
  expect_fault(
      [] {
        if (threadIdx.x != 3) inputs_ready();
      },
      32, "a thread of a chained launch returns before cuda::inputs_ready", true);
}

}  // namespace
}  // namespace helios::cuda_host
