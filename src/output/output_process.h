// The DP group's output process (P056): token ids in, text deltas out, straight to the gateway.
//
// Sockets (docs/design/flowserve.md, "Messages"):
//   in      PULL, bound on `listen_address` (ipc:// or tcp://). From the DP group:
//           kRequest  -- an EngineRequest placed on the group; the group forwards it here
//                        before its first tokens (same socket, so order holds). Registers
//                        the request's output options, choices (n) and reply_to.
//           kTokens   -- TokenDelta[] of one step; deltas of unknown requests are dropped.
//           kCancel   -- the request is gone (client disconnect): its state is dropped.
//           kShutdown -- return.
//   replies PUSH, one per distinct `reply_to` address (connected on first use, cached):
//           kOutput with the OutputDelta[] a received kTokens produced for that gateway.
//   cancel  PUSH, connected to `cancel_address` (the DP group's control socket) when given:
//           kCancel{request_id} once every choice of a request has finished here and one of
//           them was finished by a stop string while the device was still generating it
//           (the device does not know stop strings).
// A request that cannot be set up (unknown parser, no tokenizer) gets one OutputDelta per
// choice with `error` set and finish_reason "abort", and a kCancel to the device.
// A malformed frame is logged and skipped; it never stops the loop.
//
// Thread-safety: run_output_process() owns its ZeroMQ context and sockets and runs on the
// calling thread (the output process's main thread; tests run it on a thread of their own).
#pragma once

#include <string>

namespace xds::output {

struct OutputProcessOptions {
  std::string model_dir;       // tokenizer files; without them every request must be ids-only
  std::string listen_address;  // bind a PULL here (from the DP group)
  std::string cancel_address;  // connect a PUSH here (to the DP group); "" = no cancel path
  int group = 0;               // the DP group's index, for log lines
  int instance = -1;           // the instance's index where a machine runs several
                               // (base/process_name.h), -1 where it runs one
};

// Serves until kShutdown; returns 0, or 1 when the sockets or the tokenizer cannot be set up
// (the reason is logged).
int run_output_process(const OutputProcessOptions& options);

}  // namespace xds::output
