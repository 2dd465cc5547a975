// A grid's blocks one after another; each block's threads as fibers on one host thread, switched
// only where CUDA threads wait for each other (__syncthreads, a shuffle), so a block runs as a GPU
// would allow and every barrier and shuffle is checked: threads of one block that wait at
// different barriers, a shuffle missing a lane of its mask, or too much shared memory end the
// launch with an error (the launch's sticky fault, runtime.cpp) and a line on stderr naming the
// kernel, the block and what went wrong. Warps run in a seeded random order, each until it waits at
// __syncthreads, and a warp's lanes in a random order between shuffles, so a read of shared memory
// that misses a barrier sees a different writer than in thread order.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_host/device.h"
#include "cuda_host/runtime.h"

// Saves the callee-saved registers on the current stack, stores its pointer in *save, and resumes
// the stack at load (x86-64 System V). The FPU and SSE control words are left alone: no kernel
// changes them, and saving them cost more than the rest of a switch.
extern "C" void helios_cuda_host_switch(void** save, void* load);
asm(R"(
  .text
  .globl helios_cuda_host_switch
  .type helios_cuda_host_switch, @function
helios_cuda_host_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size helios_cuda_host_switch, .-helios_cuda_host_switch
)");

namespace helios::cuda_host {
namespace {

constexpr size_t kStackBytes = 64 * 1024;  // a kernel's locals and the host library calls it makes
constexpr uint64_t kStackCanary = 0x5AFEC0DEDEADBEEFull;
constexpr size_t kStaticSharedLimit = 48 * 1024;   // per block, as on sm_80 and sm_90
constexpr size_t kDynamicSharedLimit = 48 * 1024;  // without cudaFuncSetAttribute's opt-in
constexpr unsigned kMaxThreads = 1024;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;  // its stack's lowest byte, where the canary is
  ThreadPlace place{};
  unsigned linear = 0;
  State state = State::kRunnable;
  unsigned exchange_round = 0;  // shuffles done: picks the exchange slots
  bool inputs_ready = false;    // has called inputs_ready() (what a chained launch's threads do first)
};

struct SharedSite {
  int site;
  size_t offset, bytes;
};

struct Block {
  const char* kernel = "";
  bool chained = false;  // a chained launch: every thread calls inputs_ready() first
  std::vector<Fiber>* fibers = nullptr;
  unsigned n_threads = 0;
  std::vector<uint64_t> slots;  // per warp: two rounds of 32 lanes' shuffle values
  std::vector<unsigned char> shared;
  size_t dynamic_bytes = 0;
  size_t static_used = 0;
  std::vector<SharedSite> sites;
  std::string fault;
  // Barrier bookkeeping: the last thread to arrive releases the others and goes on.
  unsigned live = 0, at_block = 0;
  std::vector<unsigned> warp_waiting, warp_mask;  // per warp: lanes waiting, and at which mask
  // The round: the warps in a random order, each run until all its lanes wait at __syncthreads or
  // have returned (a warp's stacks stay in cache through its shuffles), its lanes visited from a
  // random start by a random stride prime to their count, again while any can go on.
  std::vector<unsigned> warp_order;
  unsigned warp_at = 0, lane_start = 0, lane_stride = 1, lanes_visited = 0;
};

thread_local void* scheduler_sp = nullptr;
thread_local Fiber* running = nullptr;
thread_local Block* block = nullptr;
// The fibers of this host thread and their stacks, kept from block to block: one mapping for all of
// them, in huge pages where the kernel gives them (a switch lands on another stack; 4 KiB pages
// would cost a TLB miss each time).
struct FiberPool {
  std::vector<Fiber> fibers;
  char* stacks = nullptr;
  ~FiberPool() {
    if (stacks) munmap(stacks, kMaxThreads * kStackBytes);
  }
};
thread_local FiberPool fiber_pool;
thread_local std::mt19937 order_rng{[] {
  const char* seed = std::getenv("HELIOS_CUDA_HOST_SEED");
  return seed ? static_cast<unsigned>(std::strtoul(seed, nullptr, 10)) : 20261207u;
}()};

unsigned lanes_of(const Block& b, unsigned warp) { return std::min(32u, b.n_threads - warp * 32); }

void begin_lane_round(Block& b, unsigned lanes) {
  b.lane_start = order_rng() % lanes;
  b.lane_stride = 1 + order_rng() % lanes;
  while (std::gcd(b.lane_stride, lanes) != 1) ++b.lane_stride;
  b.lanes_visited = 0;
}

void begin_round(Block& b) {
  std::shuffle(b.warp_order.begin(), b.warp_order.end(), order_rng);
  b.warp_at = 0;
  begin_lane_round(b, lanes_of(b, b.warp_order[0]));
}

// The next thread of the round that can run, or null when the round is over.
Fiber* next_in_round(Block& b) {
  std::vector<Fiber>& fs = *b.fibers;
  while (b.warp_at < b.warp_order.size()) {
    const unsigned warp = b.warp_order[b.warp_at], lanes = lanes_of(b, warp);
    while (b.lanes_visited < lanes) {
      Fiber& f = fs[warp * 32 + (b.lane_start + b.lanes_visited * b.lane_stride) % lanes];
      ++b.lanes_visited;
      if (f.state == State::kRunnable) return &f;
    }
    bool again = false;
    for (unsigned l = 0; l < lanes && !again; ++l) again = fs[warp * 32 + l].state == State::kRunnable;
    if (!again && ++b.warp_at == b.warp_order.size()) break;
    begin_lane_round(b, lanes_of(b, b.warp_order[b.warp_at]));
  }
  return nullptr;
}

// The running fiber waits: straight to the round's next thread (one switch, not two through the
// scheduler), or back to the scheduler when the round is over.
void wait_here() {
  Fiber* me = running;
  if (Fiber* next = block->fault.empty() ? next_in_round(*block) : nullptr) {
    running = next;
    helios_cuda_host_switch(&me->sp, next->sp);
  } else {
    helios_cuda_host_switch(&me->sp, scheduler_sp);
  }
}

[[noreturn]] void fail_in_fiber(const std::string& what) {
  if (block->fault.empty()) block->fault = what;
  running->state = State::kExited;
  helios_cuda_host_switch(&running->sp, scheduler_sp);
  std::abort();  // a faulted fiber is never resumed
}

void release_block_barrier(Block& b) {
  std::vector<Fiber>& fs = *b.fibers;
  for (unsigned i = 0; i < b.n_threads; ++i) {
    if (fs[i].state == State::kAtBlockBarrier) fs[i].state = State::kRunnable;
  }
  b.at_block = 0;
}

thread_local std::function<void()>* body_of_block = nullptr;

// A chained launch's thread that waits at a barrier or shuffle, or returns, before inputs_ready()
// may have touched memory the kernel before it still writes.
void check_inputs_ready(const char* at) {
  if (block->chained && !running->inputs_ready) {
    fail_in_fiber(std::string("a thread of a chained launch ") + at +
                  " before cuda::inputs_ready(): it may read what the kernel before it has not yet written");
  }
}

[[noreturn]] void fiber_entry() {
  (*body_of_block)();
  check_inputs_ready("returns");
  Block& b = *block;
  running->state = State::kExited;
  // Threads that have returned no longer count at __syncthreads, as on the GPU.
  if (--b.live > 0 && b.at_block == b.live) release_block_barrier(b);
  wait_here();
  std::abort();
}

void prepare_stack(FiberPool& pool, unsigned i) {
  if (!pool.stacks) {
    void* m = mmap(nullptr, kMaxThreads * kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "cuda_host: no memory for fiber stacks\n");
      std::abort();
    }
    madvise(m, kMaxThreads * kStackBytes, MADV_HUGEPAGE);
    pool.stacks = static_cast<char*>(m);
  }
  Fiber& f = pool.fibers[i];
  f.stack = pool.stacks + i * kStackBytes;
  *reinterpret_cast<uint64_t*>(f.stack) = kStackCanary;  // checked after the block: no guard pages
  // As helios_cuda_host_switch leaves a stack: six registers, then fiber_entry as the return
  // address, entered with the stack 8 bytes off 16-byte alignment like any call. The tops are
  // staggered by a few cache lines, or every fiber's hot frames would share the same cache sets.
  auto* top = reinterpret_cast<uint64_t*>(f.stack + kStackBytes - (i % 64) * 320);
  uint64_t* sp = top;
  *--sp = 0;  // fiber_entry's own return address: it never returns
  *--sp = reinterpret_cast<uint64_t>(&fiber_entry);
  for (int r = 0; r < 6; ++r) *--sp = 0;
  f.sp = sp;
}

std::string block_name(const Block& b, const ThreadPlace& p) {
  return std::string(b.kernel) + " block (" + std::to_string(p.block_idx.x) + "," + std::to_string(p.block_idx.y) +
         "," + std::to_string(p.block_idx.z) + ")";
}

std::string stuck_report(const Block& b) {
  const std::vector<Fiber>& fs = *b.fibers;
  for (unsigned w = 0; w * 32 < b.n_threads; ++w) {
    unsigned at_warp = 0, at_block = 0, exited = 0, mask = 0;
    for (unsigned l = 0; l < 32 && w * 32 + l < b.n_threads; ++l) {
      const Fiber& f = fs[w * 32 + l];
      if (f.state == State::kAtWarpBarrier) at_warp |= 1u << l, mask = b.warp_mask[w];
      if (f.state == State::kAtBlockBarrier) at_block |= 1u << l;
      if (f.state == State::kExited) exited |= 1u << l;
    }
    if (at_warp) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "warp %u: lanes 0x%08x wait at a shuffle of mask 0x%08x while lanes 0x%08x wait at "
                    "__syncthreads and lanes 0x%08x have returned",
                    w, at_warp, mask, at_block, exited);
      return line;
    }
  }
  return "threads wait at __syncthreads that others never reach";
}

void run_block(const char* kernel, uint3 block_idx, dim3 grid, dim3 dims, size_t dynamic_bytes, bool chained,
               std::function<void()>& body) {
  Block b;
  b.kernel = kernel;
  b.chained = chained;
  b.n_threads = dims.x * dims.y * dims.z;
  b.dynamic_bytes = dynamic_bytes;
  b.shared.assign(dynamic_bytes + kStaticSharedLimit, 0xFF);
  b.slots.assign(static_cast<size_t>((b.n_threads + 31) / 32) * 64, 0);
  std::vector<Fiber>& pool = fiber_pool.fibers;
  if (pool.size() < kMaxThreads) pool.resize(kMaxThreads);
  b.fibers = &pool;
  for (unsigned i = 0; i < b.n_threads; ++i) {
    Fiber& f = pool[i];
    f.linear = i;
    f.place = ThreadPlace{uint3{i % dims.x, i / dims.x % dims.y, i / (dims.x * dims.y)}, block_idx, dims, grid};
    f.state = State::kRunnable;
    f.exchange_round = 0;
    f.inputs_ready = false;
    prepare_stack(fiber_pool, i);
  }
  b.live = b.n_threads;
  b.warp_waiting.assign((b.n_threads + 31) / 32, 0);
  b.warp_mask.assign((b.n_threads + 31) / 32, 0);
  b.warp_order.resize((b.n_threads + 31) / 32);
  std::iota(b.warp_order.begin(), b.warp_order.end(), 0u);
  block = &b;
  body_of_block = &body;
  for (;;) {
    begin_round(b);
    if (Fiber* first = next_in_round(b)) {
      running = first;
      helios_cuda_host_switch(&scheduler_sp, first->sp);
      running = nullptr;
    }
    if (!b.fault.empty() || b.live == 0) break;
    bool runnable = false;
    for (unsigned i = 0; i < b.n_threads && !runnable; ++i) runnable = pool[i].state == State::kRunnable;
    if (!runnable) {  // every live thread waits, and none of the waits can end
      b.fault = stuck_report(b);
      break;
    }
  }
  block = nullptr;
  for (unsigned i = 0; i < b.n_threads; ++i) {
    if (*reinterpret_cast<const uint64_t*>(pool[i].stack) != kStackCanary) {
      std::fprintf(stderr, "cuda_host: kernel %s overflowed a fiber's %zu-byte stack\n", kernel, kStackBytes);
      std::abort();
    }
  }
  if (!b.fault.empty()) {
    const std::string where = block_name(b, pool[0].place);
    report_kernel_fault(where + ": " + b.fault);
  }
}

// A kernel that touches memory outside every allocation faults on a guard page (runtime.cpp): say
// which kernel, block and thread did, then let the fault end the process as it would have.
void report_stray_access(int, siginfo_t* info, void*) {
  if (!running || !block) return;  // not a kernel: the default action, now restored, follows
  const ThreadPlace& p = running->place;
  char line[400];
  const int n = std::snprintf(line, sizeof line,
                              "cuda_host: kernel fault: %s block (%u,%u,%u) thread (%u,%u,%u) touched %p, outside "
                              "every allocation (past the end of one, or before it)\n",
                              block->kernel, p.block_idx.x, p.block_idx.y, p.block_idx.z, p.thread_idx.x,
                              p.thread_idx.y, p.thread_idx.z, info->si_addr);
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(std::min<int>(n, sizeof line - 1)));
}

const bool stray_access_reported = [] {
  struct sigaction action {};
  action.sa_sigaction = report_stray_access;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;  // returning retries the access, which now ends the process
  sigemptyset(&action.sa_mask);
  return sigaction(SIGSEGV, &action, nullptr) == 0;
}();

}  // namespace

const ThreadPlace& place() { return running->place; }

void inputs_ready() { running->inputs_ready = true; }

void sync_block() {
  check_inputs_ready("waits at __syncthreads");
  Block& b = *block;
  running->state = State::kAtBlockBarrier;
  if (++b.at_block == b.live) {
    release_block_barrier(b);  // the last to arrive: everyone goes on, this thread first
    return;
  }
  wait_here();
}

void sync_warp(unsigned mask) {
  check_inputs_ready("waits at a shuffle or __syncwarp");
  Block& b = *block;
  const unsigned lane = running->linear % 32, warp = running->linear / 32;
  if (!(mask & (1u << lane))) fail_in_fiber("a lane calls __syncwarp or a shuffle with a mask that leaves it out");
  if (b.warp_waiting[warp] && b.warp_mask[warp] != mask) {
    fail_in_fiber("lanes of warp " + std::to_string(warp) + " wait at shuffles or __syncwarp with different masks");
  }
  b.warp_mask[warp] = mask;
  b.warp_waiting[warp] |= 1u << lane;
  running->state = State::kAtWarpBarrier;
  if ((b.warp_waiting[warp] & mask) == mask) {  // the last lane of the mask: the warp goes on
    std::vector<Fiber>& fs = *b.fibers;
    for (unsigned l = 0; l < 32; ++l) {
      if (mask & (1u << l)) fs[warp * 32 + l].state = State::kRunnable;
    }
    b.warp_waiting[warp] = 0;
    return;
  }
  wait_here();
}

uint64_t exchange(unsigned mask, uint64_t bits, int src_lane) {
  const unsigned lane = running->linear % 32, warp = running->linear / 32;
  // Two rounds of slots: a lane can be one shuffle ahead of its warp, never two.
  uint64_t* round = &block->slots[warp * 64 + (running->exchange_round++ & 1) * 32];
  round[lane] = bits;
  sync_warp(mask);
  if (src_lane < 0 || src_lane >= 32 || !(mask & (1u << src_lane))) {
    fail_in_fiber("a shuffle reads lane " + std::to_string(src_lane) + ", outside its mask");
  }
  return round[src_lane];
}

void* block_shared(int site, size_t bytes, size_t align) {
  Block& b = *block;
  for (const SharedSite& s : b.sites) {
    if (s.site == site && s.bytes == bytes) return b.shared.data() + b.dynamic_bytes + s.offset;
  }
  const size_t offset = (b.static_used + align - 1) / align * align;
  if (offset + bytes > kStaticSharedLimit) {
    fail_in_fiber("static shared memory over " + std::to_string(kStaticSharedLimit) + " bytes");
  }
  b.static_used = offset + bytes;
  b.sites.push_back({site, offset, bytes});
  return b.shared.data() + b.dynamic_bytes + offset;
}

void* dynamic_shared() { return block->shared.data(); }

float mul_rn(float a, float b) { return a * b; }
float add_rn(float a, float b) { return a + b; }
float sub_rn(float a, float b) { return a - b; }
float div_rn(float a, float b) { return a / b; }

cudaError_t launch_error(dim3 grid, dim3 block_dims, size_t dynamic_smem) {
  const uint64_t threads = uint64_t{block_dims.x} * block_dims.y * block_dims.z;
  if (threads == 0 || threads > kMaxThreads || block_dims.z > 64) return cudaErrorInvalidConfiguration;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) return cudaErrorInvalidConfiguration;
  // Over 48 KiB of dynamic shared memory needs cudaFuncSetAttribute's opt-in, which no kernel uses.
  if (dynamic_smem > kDynamicSharedLimit) return cudaErrorInvalidValue;
  return cudaSuccess;
}

void run_grid(const char* kernel, dim3 grid, dim3 dims, size_t dynamic_smem, bool chained,
              std::function<void()>& body) {
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        run_block(kernel, uint3{x, y, z}, grid, dims, dynamic_smem, chained, body);
        if (kernel_faulted()) return;
      }
    }
  }
}

}  // namespace helios::cuda_host
