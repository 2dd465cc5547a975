// The CPU features this build's SIMD code was compiled for (HELIOS_CPU_ARCH), checked against the
// CPU it runs on, so that a binary built elsewhere says what is missing instead of dying of SIGILL.
#pragma once

#include <string>

namespace helios {

// The compiled-for features this CPU lacks, space-separated ("" when it has them all).
std::string missing_cpu_features();

// For main(): prints the missing features and how to rebuild to stderr, and returns false.
bool check_cpu_features(const char* program);

}  // namespace helios
