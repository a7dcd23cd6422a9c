// A synthetic Kimi K2 tokenizer for random checkpoints (mkmodel --arch kimi_k2): tiktoken.model
// + tokenizer_config.json in the published layout, loadable by Tokenizer::load().
//
// For a model vocabulary of V ids (config.json's vocab_size; V >= 1024) it writes, as Kimi K2
// publishes for V = 163840:
//   tiktoken.model          V - 256 ranked tokens: the 256 single bytes (rank = byte value),
//                           then tokens that each join two earlier ones (drawn from a
//                           splitmix64 stream keyed by `seed`, at most 16 bytes, no repeats);
//   tokenizer_config.json   added_tokens_decoder for ids [V - 256, V): Kimi's special tokens
//                           at their published offsets from V - 256 ([BOS] +0, [EOS] +1,
//                           <|im_end|> +2, <|im_user|> +3, <|im_assistant|> +4, [EOT] +9,
//                           <|im_system|> +10, the tool-call markers +11..+15,
//                           <|im_middle|> +17, <think> +22, </think> +23, [UNK] +254,
//                           [PAD] +255, the rest "<|reserved_token_ID|>"); bos/eos/unk/pad
//                           tokens; and a chat template in Kimi K2's turn format
//                           (tool_declare, <|im_user|>user<|im_middle|>...<|im_end|>, tool
//                           calls as <|tool_calls_section_begin|>...).
// As tokenization_kimi.py reads it, the tokenizer then has V + 2 ids (two reserved ids past V
// that the model never produces). The output is a pure function of (V, seed).
// Thread-safety: pure apart from the files it writes.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace xds {

// Writes the two files into out_dir (which must exist), replacing files of the same names.
// Errors: vocab_size below 1024 or above 2^30, an unwritable directory (naming the path).
Status write_kimi_synthetic_tokenizer(const std::string& out_dir, int64_t vocab_size,
                                      uint64_t seed);

}  // namespace xds
