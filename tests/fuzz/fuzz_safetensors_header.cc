// Fuzz target: the safetensors header parser (model/safetensors.h,
// parse_safetensors_header). Input: the bytes of a whole .safetensors file.
//
// Checked beyond "no crash, no hang, no exception", for a file that parses, against the
// format as safetensors.h states it: the tensors lie in file order, each inside the data area
// right after the last one and together covering it exactly, and each holds
// numel * dtype size bytes. Their first and last bytes are read (ASan: inside the input).
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  auto header = xds::parse_safetensors_header(bytes, size, "fuzz.safetensors");
  if (!header.ok()) {
    XDS_CHECK(!header.status().message().empty(), "an error without a message");
    return 0;
  }
  // The data area starts after the u64 length and the JSON header.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  const std::byte* area = bytes + 8 + n;
  const std::byte* end = bytes + size;
  const std::byte* next = area;
  for (const xds::TensorView& t : header.value().tensors) {
    XDS_CHECK(t.data == next, "tensor '{}' at offset {}, expected {}", t.name, t.data - area,
              next - area);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      XDS_CHECK(d >= 0, "tensor '{}': dim {}", t.name, d);
      numel *= static_cast<uint64_t>(d);
    }
    XDS_CHECK(t.nbytes == numel * static_cast<uint64_t>(xds::dtype_size(t.dtype)),
              "tensor '{}': {} bytes for shape {}", t.name, t.nbytes, t.shape_string());
    XDS_CHECK(t.nbytes <= static_cast<size_t>(end - t.data), "tensor '{}' beyond the file", t.name);
    if (t.nbytes > 0) {
      volatile std::byte first = t.data[0];
      volatile std::byte last = t.data[t.nbytes - 1];
      (void)first;
      (void)last;
    }
    next = t.data + t.nbytes;
  }
  XDS_CHECK(next == end, "the tensors end {} bytes before the file", end - next);
  return 0;
}
