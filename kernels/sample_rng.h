// The counter-based random draw shared by ref_sample and launch_sample: a pure function of
// (seed, step), so the CPU twin and the GPU kernel draw the same uniform without shared state.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HELIOS_HOST_DEVICE __host__ __device__
#else
#define HELIOS_HOST_DEVICE
#endif

namespace helios::kernels {

// splitmix64's finaliser: every input bit affects every output bit.
HELIOS_HOST_DEVICE inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1): the top 24 bits, so the float holds the value exactly.
HELIOS_HOST_DEVICE inline float sample_uniform(uint64_t seed, uint64_t step) {
  const uint64_t h = splitmix64(seed ^ splitmix64(step));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace helios::kernels
