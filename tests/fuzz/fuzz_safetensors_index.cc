// Fuzz target: the model.safetensors.index.json parser (model/safetensors.h,
// parse_safetensors_index). Input: the file's text.
//
// Checked beyond "no crash, no hang, no exception": every shard of a weight map that parses is
// a plain file name in the checkpoint's directory (not empty, no '/', no NUL, not "." or
// ".."), as safetensors.h promises; so Checkpoint::open never leaves the directory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto map = xds::parse_safetensors_index(text, "model.safetensors.index.json");
  if (!map.ok()) {
    XDS_CHECK(!map.status().message().empty(), "an error without a message");
    return 0;
  }
  for (const auto& [tensor, shard] : map.value()) {
    XDS_CHECK(!shard.empty() && shard.find('/') == std::string::npos &&
                  shard.find('\0') == std::string::npos && shard != "." && shard != "..",
              "tensor '{}': shard '{}' is not a plain file name", tensor, shard);
  }
  return 0;
}
