// Writes tensors held in memory as safetensors shards plus model.safetensors.index.json
// (the Hugging Face sharded layout): tensors in the given order, a new shard when the next
// tensor would take the current one past max_shard_bytes (a tensor larger than that gets a
// shard alone); files "model-0000i-of-0000n.safetensors"; header "__metadata__" {"format":
// "pt"}, padded with spaces to a multiple of 8 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace xds {

struct OutTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major
  std::vector<std::byte> bytes;  // numel · dtype_size(dtype)
};

// Into the existing directory `dir`. Errors: a tensor whose byte count does not match its
// shape and dtype (naming it), an I/O failure (naming the file).
Status write_sharded_safetensors(const std::string& dir, const std::vector<OutTensor>& tensors,
                                 int64_t max_shard_bytes);

// A rewritten checkpoint's other files (tokenizer, generation config, ...): the regular files
// of `from` copied into `to` (same names replaced), except config.json, the safetensors
// shards, their index and the names in `also_skip`.
Status copy_checkpoint_side_files(const std::string& from, const std::string& to,
                                  std::initializer_list<std::string_view> also_skip = {});

}  // namespace xds
