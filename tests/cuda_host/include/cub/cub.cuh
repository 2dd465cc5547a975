// The two pieces of CUB the kernels use, for the host emulation (tests/cuda_host): a device-wide
// radix sort of key/value pairs (a stable sort on the key's bits [begin_bit, end_bit)) and a
// block-wide inclusive sum. The sums are added in thread order, CUB's in a tree: a double's last
// bit can differ.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "cuda_host/device.h"

namespace helios::cuda_host {
void enqueue_work(cudaStream_t stream, std::function<void()> work);
}

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector = 0;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() const { return d_buffers[selector]; }
  T* Alternate() const { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, DoubleBuffer<K>& keys, DoubleBuffer<V>& values,
                               int n, int begin_bit = 0, int end_bit = sizeof(K) * 8, cudaStream_t stream = nullptr) {
    if (!temp) {
      temp_bytes = 256;
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit > end_bit) {
      return cudaErrorInvalidValue;
    }
    const K* k_in = keys.Current();
    const V* v_in = values.Current();
    K* k_out = keys.Alternate();
    V* v_out = values.Alternate();
    keys.selector ^= 1;
    values.selector ^= 1;
    helios::cuda_host::enqueue_work(stream, [=] {
      const int width = end_bit - begin_bit;
      const uint64_t mask = width >= 64 ? ~uint64_t{0} : ((uint64_t{1} << width) - 1);
      auto bits = [&](const K& k) { return (static_cast<uint64_t>(k) >> begin_bit) & mask; };
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bits(k_in[a]) < bits(k_in[b]); });
      std::vector<K> ks(n);
      std::vector<V> vs(n);
      for (int i = 0; i < n; ++i) ks[i] = k_in[order[i]], vs[i] = v_in[order[i]];
      std::copy(ks.begin(), ks.end(), k_out);
      std::copy(vs.begin(), vs.end(), v_out);
    });
    return cudaSuccess;
  }
};

template <typename T, int kBlockThreads>
class BlockScan {
 public:
  struct TempStorage {
    T values[kBlockThreads];
  };
  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  void InclusiveSum(T input, T& output) {
    const unsigned t = threadIdx.x;
    storage_.values[t] = input;
    __syncthreads();
    T sum = T();
    for (unsigned i = 0; i <= t; ++i) sum += storage_.values[i];
    output = sum;
    __syncthreads();  // the storage is free again
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub
