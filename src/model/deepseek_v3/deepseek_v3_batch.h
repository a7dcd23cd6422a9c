// The internal per-step batch description shared by the DeepSeek-V3 forward files.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/deepseek_v3/deepseek_v3.h"

namespace xds {

struct DeepseekV3Model::Batch {
  struct Chunk {
    std::span<const int32_t> blocks;  // the sequence's block table
    int64_t start_pos;                // position of the chunk's first token
    int64_t begin;                    // index of its first token in batch order
    int64_t count;
  };
  int64_t n = 0;             // tokens in the step
  std::vector<int64_t> pos;  // [n] absolute position of each token
  std::vector<Chunk> chunks;

  void clear() {
    n = 0;
    pos.clear();
    chunks.clear();
  }
};

}  // namespace xds
