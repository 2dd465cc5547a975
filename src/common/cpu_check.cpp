#include "common/cpu_check.h"

#include <cstdio>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace helios {

std::string missing_cpu_features() {
  std::string missing;
  [[maybe_unused]] auto need = [&missing](bool has, const char* name) {
    if (!has) missing += missing.empty() ? name : std::string(" ") + name;
  };
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#if defined(__AVX__)
  need(__builtin_cpu_supports("avx"), "avx");
#endif
#if defined(__AVX2__)
  need(__builtin_cpu_supports("avx2"), "avx2");
#endif
#if defined(__FMA__)
  need(__builtin_cpu_supports("fma"), "fma");
#endif
#if defined(__F16C__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // CPUID leaf 1, ECX bit 29 (clang's builtin lacks "f16c")
  need(__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx >> 29 & 1), "f16c");
#endif
#if defined(__BMI2__)
  need(__builtin_cpu_supports("bmi2"), "bmi2");
#endif
#if defined(__AVX512F__)
  need(__builtin_cpu_supports("avx512f"), "avx512f");
#endif
#if defined(__AVX512BW__)
  need(__builtin_cpu_supports("avx512bw"), "avx512bw");
#endif
#if defined(__AVX512VL__)
  need(__builtin_cpu_supports("avx512vl"), "avx512vl");
#endif
#if defined(__AVX512VNNI__)
  need(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
#endif
#endif
  return missing;
}

bool check_cpu_features(const char* program) {
  const std::string missing = missing_cpu_features();
  if (missing.empty()) return true;
  std::fprintf(stderr,
               "%s: this build's kernels need CPU features this machine lacks (%s); rebuild here, or "
               "for any AVX2 machine with cmake -DHELIOS_CPU_ARCH=x86-64-v3\n",
               program, missing.c_str());
  return false;
}

}  // namespace helios
