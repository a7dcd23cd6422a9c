// Fuzz target: the control messages' wire codec (protocol/messages.h). Input: the bytes of one
// ZeroMQ frame, as a peer could send them.
//
// Checked beyond "no crash, no hang, no exception" (decode() promises an InvalidArgument for
// anything malformed): a message that decodes survives a round trip, decode(encode(m)) is a
// message of the same kind that encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/check.h"
#include "protocol/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = xds::protocol::decode(data, size);
  if (!m.ok()) {
    XDS_CHECK(m.status().code() == xds::StatusCode::kInvalidArgument, "{}", m.status().to_string());
    return 0;
  }
  const std::string bytes = xds::protocol::encode(m.value());
  auto again = xds::protocol::decode(bytes.data(), bytes.size());
  XDS_CHECK(again.ok(), "the encoding of a decoded {} message does not decode: {}",
            xds::protocol::kind_name(xds::protocol::kind_of(m.value())),
            again.status().to_string());
  XDS_CHECK(xds::protocol::kind_of(again.value()) == xds::protocol::kind_of(m.value()),
            "the kind changed in a round trip");
  XDS_CHECK(xds::protocol::encode(again.value()) == bytes, "a {} message changed in a round trip",
            xds::protocol::kind_name(xds::protocol::kind_of(m.value())));
  return 0;
}
