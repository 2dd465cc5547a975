// A copy of a GGUF file with keys or tensors added, for tests of metadata no fetchable file has.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "helios/gguf.h"

namespace helios::testing {

// Writes every key and tensor of the file at `path` to `out_path`, then what `extra` adds (a key
// set again replaces the copied one), one tensor in memory at a time.
inline void copy_gguf_with(const std::string& path, const std::string& out_path,
                           const std::function<void(GgufWriter&)>& extra) {
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  GgufWriter w;
  for (const std::string& key : (*file)->keys()) w.set_value(key, *(*file)->find(key));
  for (const GgufTensorInfo& t : (*file)->tensors()) {  // read from the open file as it is written
    const auto bytes = [&t] { return std::vector<uint8_t>(t.data, t.data + t.n_bytes); };
    ASSERT_TRUE(w.add_tensor_lazy(t.name, t.type, t.dims, bytes).ok());
  }
  extra(w);
  const Status written = w.write(out_path);
  ASSERT_TRUE(written.ok()) << written.to_string();
}

}  // namespace helios::testing
