// Control messages on ZeroMQ sockets: one protocol::Message per frame (protocol/messages.h).
//
// Thread-safety: a zmq::socket_t belongs to one thread; so do these calls on it.
#pragma once

#include <optional>
#include <string>

#include <zmq.hpp>

#include "base/status.h"
#include "protocol/messages.h"

namespace xds::protocol {

// Sends `m` (blocking unless `dontwait`; a full queue with dontwait is Unavailable).
Status send_message(zmq::socket_t& socket, const Message& m, bool dontwait = false);
// Receives one message; nullopt when `dontwait` and nothing is queued. A malformed frame is
// an InvalidArgument (the caller logs it and goes on: a bad peer must not stop the loop).
Result<std::optional<Message>> recv_message(zmq::socket_t& socket, bool dontwait);

// A process-unique address for an ipc socket in Linux's abstract namespace: nothing in the
// file system, gone with the last process that holds it.
std::string abstract_ipc_address(const std::string& name);

}  // namespace xds::protocol
