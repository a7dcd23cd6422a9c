#include "protocol/zmq_io.h"

#include <unistd.h>

#include <fmt/format.h>

namespace xds::protocol {

Status send_message(zmq::socket_t& socket, const Message& m, bool dontwait) {
  const std::string bytes = encode(m);
  try {
    const auto sent = socket.send(zmq::buffer(bytes),
                                  dontwait ? zmq::send_flags::dontwait : zmq::send_flags::none);
    if (!sent) return unavailable("control socket: send queue full");
  } catch (const zmq::error_t& e) {
    return unavailable("control socket: send failed: {}", e.what());
  }
  return {};
}

Result<std::optional<Message>> recv_message(zmq::socket_t& socket, bool dontwait) {
  zmq::message_t frame;
  try {
    const auto got =
        socket.recv(frame, dontwait ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) return std::optional<Message>();
  } catch (const zmq::error_t& e) {
    return unavailable("control socket: receive failed: {}", e.what());
  }
  XDS_ASSIGN_OR_RETURN(Message m, decode(frame.data(), frame.size()));
  return std::optional<Message>(std::move(m));
}

std::string abstract_ipc_address(const std::string& name) {
  return fmt::format("ipc://@xdeepserve-{}-{}", ::getpid(), name);
}

}  // namespace xds::protocol
