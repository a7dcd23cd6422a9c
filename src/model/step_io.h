// What one forward step of a model takes and gives (CausalLm::forward, forward_mtp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace xds {

// A run of consecutive tokens of one sequence (a prefill chunk, or one decode token)
// starting at `start_pos`. The cache already holds positions [0, start_pos) of the
// sequence; the step writes [start_pos, start_pos + tokens.size()).
struct TokenChunk {
  int64_t start_pos = 0;  // position of tokens[0]
  std::span<const int32_t> tokens;
  // The sequence's block table: position p lives in block blocks[p / block_size]. It must
  // cover [0, start_pos + tokens.size()) (forward checks it); the blocks written by this step
  // must be writable by this sequence alone (BlockAllocator::writable: the caller copies on
  // write). The caller reserves the blocks, not forward().
  std::span<const int32_t> blocks;
  bool all_logits = false;  // logits for every token, else only the last
};

// One run of MTP rows: row i extends the hidden at position start_pos + i with
// token_{start_pos + i + 1}, and is cached at that position in the MTP layer's planes.
// The hidden of a row is the main model's final-normed hidden at its position (teacher
// forcing, the draft-extend of committed positions), or for a chained draft the previous
// draft row's MTP residual output (StepOutput::hidden of forward_mtp), standing in for the
// main model's hidden at a position it has not computed yet.
struct MtpChunk {
  int64_t start_pos = 0;                 // position of the first row
  std::span<const int32_t> next_tokens;  // token_{pos+1} for each row
  const float* hidden = nullptr;         // [rows, D] (see above); hnorm is applied inside
  std::span<const int32_t> blocks;       // the block table, as TokenChunk::blocks
};

struct StepOutput {
  std::vector<float> logits;          // [rows, vocab]
  std::vector<int64_t> logit_tokens;  // [rows] token index (batch order) of each row
  // [n_tokens, D], batch order. forward: the final-normed hidden of every token (the MTP
  // input of its position). forward_mtp: the MTP layer's residual output of every row before
  // shared_head.norm (the input hidden of the chained draft after it).
  std::vector<float> hidden;
};

// Called with (layer, token index in batch order, chosen expert ids, ascending) for every
// MoE layer.
using RoutingObserver = std::function<void(int64_t, int64_t, std::span<const int32_t>)>;

}  // namespace xds
