#include "helios/backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(HELIOS_WITH_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace helios {

void Backend::add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows,
                          int32_t dim, float eps, float* out) {
  add(x, y, static_cast<int64_t>(n_rows) * dim);
  rmsnorm(x, weight, n_rows, dim, eps, out);
}

void Backend::embedding_rows(const int32_t* host_tokens, int32_t n_tokens, const WeightMatrix& table,
                             float* out) {
  embedding(host_tokens, n_tokens, static_cast<const float*>(table.data), table.n_in, out);
}

void Backend::exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* host_top1,
                         float* host_top1_prob, float* host_margin, float* host_entropy) {
  std::vector<float> host(static_cast<size_t>(n_rows) * n_vocab);
  download(host.data(), logits, host.size());
  kernels::ref_exit_stats(host.data(), n_rows, n_vocab, host_top1, host_top1_prob, host_margin,
                          host_entropy);
}

void Backend::sample_rows(const float* logits, int32_t n_vocab, const kernels::SampleRow* host_rows, int32_t n_rows,
                          const kernels::LogitAdjust* host_adjust, int32_t /*n_adjust*/, int32_t* host_token,
                          float* host_logprob) {
  std::vector<float> host(static_cast<size_t>(n_rows) * n_vocab);
  std::vector<kernels::SampleRow> rows(host_rows, host_rows + n_rows);
  for (int32_t r = 0; r < n_rows; ++r) {  // row r of `host`: the twin reads only the rows sampled
    download(host.data() + static_cast<size_t>(r) * n_vocab, logits + static_cast<size_t>(rows[r].logits_row) * n_vocab,
             n_vocab);
    rows[r].logits_row = r;
  }
  kernels::ref_sample_rows(host.data(), n_vocab, rows.data(), n_rows, host_adjust, host_token, host_logprob);
}

Status dequantize_weight_row(const WeightMatrix& w, int32_t row, float* out) {
  const int64_t row_bytes = tensor_row_bytes(w.type, w.n_in);
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * row_bytes;
  thread_local std::vector<uint8_t> gguf_row;
  if (w.layout == WeightLayout::kInterleaved) {
    gguf_row.resize(static_cast<size_t>(row_bytes));
    kernels::ref_deinterleave_row(static_cast<uint32_t>(w.type), w.data, w.n_in, row, gguf_row.data());
    src = gguf_row.data();
  }
  return dequantize_row(w.type, src, out, w.n_in);
}

StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, int n_threads) {
  if (name == "cpu") return make_cpu_backend(n_threads);
  const bool is_cuda = name == "cuda" || name.rfind("cuda:", 0) == 0;
#if defined(HELIOS_WITH_CUDA)
  if (is_cuda) {
    int device = 0;
    if (name.size() > 5) {
      const std::string index = name.substr(5);
      char* end = nullptr;
      const long d = std::strtol(index.c_str(), &end, 10);
      if (index.empty() || *end != '\0' || d < 0 || d > 1023) {
        return invalid_argument("backend '" + name + "': expected cuda or cuda:N with N a device index");
      }
      device = static_cast<int>(d);
    }
    return make_cuda_backend(device);
  }
  return invalid_argument("unknown backend '" + name + "' (this build supports: cpu, cuda, cuda:N)");
#else
  if (is_cuda) {
    return invalid_argument("backend '" + name + "' is not in this build: it was configured without CUDA "
                            "(this build supports: cpu); reconfigure with cmake -DHELIOS_CUDA=ON on a "
                            "machine with the CUDA toolkit, e.g. cmake -S . -B build-cuda -DHELIOS_CUDA=ON");
  }
  return invalid_argument("unknown backend '" + name + "' (this build supports: cpu)");
#endif
}

float* Backend::alloc_host(size_t n_floats) {
  if (n_floats > SIZE_MAX / sizeof(float)) return nullptr;
  return new (std::nothrow) float[std::max<size_t>(n_floats, 1)];
}

void Backend::free_host(float* p) { delete[] p; }

HostBuffer::HostBuffer(Backend* backend, size_t n_floats) : size_(n_floats) {
  if (n_floats == 0 || n_floats > SIZE_MAX / sizeof(float)) return;
  if (float* pinned = backend->alloc_host(n_floats)) {
    data_ = std::unique_ptr<float[], Free>(pinned, Free{backend});
  } else {
    data_ = std::unique_ptr<float[], Free>(new (std::nothrow) float[n_floats], Free{nullptr});
  }
}

void HostBuffer::Free::operator()(float* p) const {
  if (backend) {
    backend->free_host(p);
  } else {
    delete[] p;
  }
}

}  // namespace helios
